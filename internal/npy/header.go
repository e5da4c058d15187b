package npy

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

var le = binary.LittleEndian

const (
	magic = "\x93NUMPY"
	// arrayAlign is numpy's ARRAY_ALIGN: the data starts at a multiple of this many bytes.
	arrayAlign = 64
	// growthAxisMaxDigits is numpy's GROWTH_AXIS_MAX_DIGITS: numpy 1.24 and later leave room after the
	// dict to rewrite the first dimension in place with up to this many digits.
	growthAxisMaxDigits = 21
	// maxHeaderLen bounds the header length a reader accepts (numpy's own default limit is 10,000 bytes;
	// a header of this package's dtypes is about 100 bytes plus a few per dimension).
	maxHeaderLen = 1 << 20
	// maxParseDepth bounds the nesting of the literals in a header dict.
	maxParseDepth = 16
)

// encodeHeader returns the magic, version, header length and padded header dict for an array, exactly as
// numpy (1.24 and later) writes them: format 1.0, or 2.0 when the header is too long for a 16-bit length.
func encodeHeader(dtype string, shape []int) []byte {
	dict := "{'descr': " + quote(dtype) + ", 'fortran_order': False, 'shape': " + formatShape(shape) + ", }"
	if len(shape) > 0 {
		dict += strings.Repeat(" ", max(0, growthAxisMaxDigits-len(strconv.Itoa(shape[0]))))
	}
	for _, v := range []struct {
		major   byte
		lenSize int
	}{{1, 2}, {2, 4}} {
		prefix := len(magic) + 2 + v.lenSize
		hlen := len(dict) + 1 // the final newline
		padlen := arrayAlign - (prefix+hlen)%arrayAlign
		total := hlen + padlen
		if v.lenSize == 2 && total > math.MaxUint16 {
			continue
		}
		out := make([]byte, 0, prefix+total)
		out = append(out, magic...)
		out = append(out, v.major, 0)
		if v.lenSize == 2 {
			out = le.AppendUint16(out, uint16(total))
		} else {
			out = le.AppendUint32(out, uint32(total))
		}
		out = append(out, dict...)
		for range padlen {
			out = append(out, ' ')
		}
		return append(out, '\n')
	}
	panic("unreachable: header longer than 4 GiB")
}

// header is the parsed content of an .npy header dict.
type header struct {
	dtype  string
	shape  []int
	nelem  int // product of shape
	nbytes int // nelem * item size
}

// parseHeader parses and validates a header dict (the text after the length field).
func parseHeader(file string, text []byte) (*header, error) {
	p := &parser{src: text}
	p.skipSpace()
	v, err := p.value(0)
	if err == nil {
		p.skipSpace()
		if p.pos < len(p.src) {
			err = p.errorf("unexpected %s after the dict", p.near())
		}
	}
	if err != nil {
		return nil, newError(file, ErrHeader, "malformed header dict %s: %s", excerpt(text), err)
	}
	d, ok := v.(pyDict)
	if !ok {
		return nil, newError(file, ErrHeader, "header %s is not a dict, want {'descr': ..., 'fortran_order': ..., 'shape': ...}", excerpt(text))
	}
	for _, k := range d.keys {
		switch k {
		case "descr", "fortran_order", "shape":
		default:
			return nil, newError(file, ErrHeader, "header has unexpected key %s, want exactly 'descr', 'fortran_order' and 'shape'", quote(k))
		}
	}
	for _, k := range []string{"descr", "fortran_order", "shape"} {
		if _, ok := d.vals[k]; !ok {
			return nil, newError(file, ErrHeader, "header has no key %s, want exactly 'descr', 'fortran_order' and 'shape'", quote(k))
		}
	}

	h := &header{}
	switch descr := d.vals["descr"].(type) {
	case string:
		if itemSize(descr) == 0 {
			return nil, newError(file, ErrDtype, "unsupported dtype %s%s, want one of %s", quote(descr), dtypeHint(descr), supportedList())
		}
		h.dtype = descr
	case pyList, pyTuple:
		return nil, newError(file, ErrDtype, "structured dtype (descr is a list of fields), want one of %s", supportedList())
	default:
		return nil, newError(file, ErrHeader, "'descr' is %s, want a dtype string such as '<f4'", describe(descr))
	}

	switch fo := d.vals["fortran_order"].(type) {
	case bool:
		if fo {
			return nil, newError(file, ErrFortranOrder, "fortran_order is True, want False (C order); save a C-contiguous array, e.g. numpy.ascontiguousarray(x)")
		}
	default:
		return nil, newError(file, ErrHeader, "'fortran_order' is %s, want True or False", describe(fo))
	}

	tup, ok := d.vals["shape"].(pyTuple)
	if !ok {
		return nil, newError(file, ErrHeader, "'shape' is %s, want a tuple of integers such as (3, 4)", describe(d.vals["shape"]))
	}
	h.shape = make([]int, len(tup))
	for i, e := range tup {
		n, ok := e.(pyInt)
		if !ok {
			return nil, newError(file, ErrHeader, "'shape' entry %d is %s, want an integer", i, describe(e))
		}
		v, err := strconv.ParseInt(string(n), 10, 0)
		if err != nil {
			return nil, newError(file, ErrShape, "shape entry %d = %s overflows int", i, string(n))
		}
		if v < 0 {
			return nil, newError(file, ErrShape, "shape entry %d = %d is negative, want >= 0", i, v)
		}
		h.shape[i] = int(v)
	}
	nelem, nbytes, msg := sizeOf(h.shape, itemSize(h.dtype))
	if msg != "" {
		return nil, newError(file, ErrShape, "shape %s with dtype %s: %s", formatShape(h.shape), quote(h.dtype), msg)
	}
	h.nelem, h.nbytes = nelem, nbytes
	return h, nil
}

// sizeOf returns the element count and byte size of a shape, or a message when either overflows int.
func sizeOf(shape []int, item int) (nelem, nbytes int, msg string) {
	prod := uint64(1)
	overflow := false
	for _, d := range shape {
		if d < 0 {
			return 0, 0, fmt.Sprintf("dimension %d is negative", d)
		}
		hi, lo := bits.Mul64(prod, uint64(d))
		if hi != 0 || lo > math.MaxInt {
			overflow = true
		}
		prod = lo
	}
	// A zero dimension makes an empty array however large the others are.
	for _, d := range shape {
		if d == 0 {
			return 0, 0, ""
		}
	}
	if overflow {
		return 0, 0, "element count overflows int"
	}
	hi, lo := bits.Mul64(prod, uint64(item))
	if hi != 0 || lo > math.MaxInt {
		return 0, 0, fmt.Sprintf("%d elements of %d bytes overflow int", prod, item)
	}
	return int(prod), int(lo), ""
}

// dtypeHint says why a dtype string is unsupported, where that is easy to tell.
func dtypeHint(d string) string {
	if len(d) < 2 {
		return ""
	}
	body := d[1:]
	switch {
	case d[0] == '>':
		if itemSize("<"+body) != 0 {
			return " (big-endian; save with dtype " + quote("<"+body) + ")"
		}
		return " (big-endian)"
	case body == "O":
		return " (object arrays need pickle)"
	case d[0] == '<' || d[0] == '|' || d[0] == '=':
		return ""
	}
	return ""
}

// excerpt quotes (part of) a header for an error message.
func excerpt(b []byte) string {
	const maxLen = 160
	s := strings.TrimRight(string(b), " \n")
	if len(s) > maxLen {
		return strconv.Quote(s[:maxLen]) + "..."
	}
	return strconv.Quote(s)
}

// The Python literal values a header dict can hold.
type (
	pyInt   string // the digits (with a leading '-' if negative), kept as text so size checks come later
	pyTuple []any
	pyList  []any
	pyNone  struct{}
	pyDict  struct {
		keys []string // in order of appearance
		vals map[string]any
	}
)

// describe names a value's Python type, with the value where it is short.
func describe(v any) string {
	switch v := v.(type) {
	case string:
		return "the string " + quote(v)
	case bool:
		if v {
			return "True"
		}
		return "False"
	case pyInt:
		return "the integer " + string(v)
	case pyTuple:
		return "a tuple"
	case pyList:
		return "a list"
	case pyDict:
		return "a dict"
	case pyNone:
		return "None"
	}
	return fmt.Sprintf("%T", v)
}

// parser reads the subset of Python literal syntax numpy writes in headers: dicts with string keys,
// tuples, lists, strings, integers (an 'L' suffix, as Python 2 wrote, is accepted), True, False, None.
type parser struct {
	src []byte
	pos int
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("at byte %d: %s", p.pos, fmt.Sprintf(format, args...))
}

// near describes the input at the current position.
func (p *parser) near() string {
	if p.pos >= len(p.src) {
		return "end of header"
	}
	end := min(p.pos+10, len(p.src))
	return strconv.Quote(strings.TrimRight(string(p.src[p.pos:end]), " \t\n\r"))
}

func (p *parser) skipSpace() {
	for p.pos < len(p.src) {
		switch p.src[p.pos] {
		case ' ', '\t', '\n', '\r', '\f', '\v':
			p.pos++
		default:
			return
		}
	}
}

// expect consumes c (after optional spaces) or fails.
func (p *parser) expect(c byte, what string) error {
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == c {
		p.pos++
		return nil
	}
	return p.errorf("want %q %s, found %s", c, what, p.near())
}

// peek returns the next non-space byte, or 0 at the end.
func (p *parser) peek() byte {
	p.skipSpace()
	if p.pos < len(p.src) {
		return p.src[p.pos]
	}
	return 0
}

func (p *parser) value(depth int) (any, error) {
	if depth > maxParseDepth {
		return nil, p.errorf("literals nested deeper than %d", maxParseDepth)
	}
	switch c := p.peek(); {
	case c == '{':
		return p.dict(depth)
	case c == '(':
		p.pos++
		elems, trailingComma, err := p.sequence(')', depth)
		if err != nil {
			return nil, err
		}
		if len(elems) == 1 && !trailingComma {
			return elems[0], nil // (x) is x in Python, not a tuple
		}
		return pyTuple(elems), nil
	case c == '[':
		p.pos++
		elems, _, err := p.sequence(']', depth)
		return pyList(elems), err
	case c == '\'' || c == '"':
		return p.str()
	case c == '-' || (c >= '0' && c <= '9'):
		return p.integer()
	case c == 'u' || c == 'b':
		// u'...' and b'...' string prefixes.
		if p.pos+1 < len(p.src) && (p.src[p.pos+1] == '\'' || p.src[p.pos+1] == '"') {
			p.pos++
			return p.str()
		}
	}
	start := p.pos
	for p.pos < len(p.src) && isIdent(p.src[p.pos]) {
		p.pos++
	}
	switch string(p.src[start:p.pos]) {
	case "True":
		return true, nil
	case "False":
		return false, nil
	case "None":
		return pyNone{}, nil
	}
	p.pos = start
	return nil, p.errorf("want a value, found %s", p.near())
}

func isIdent(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// sequence parses comma-separated values up to close (the opening bracket already consumed).
func (p *parser) sequence(close byte, depth int) (elems []any, trailingComma bool, err error) {
	for {
		if p.peek() == close {
			p.pos++
			return elems, trailingComma, nil
		}
		if len(elems) > 0 && !trailingComma {
			return nil, false, p.errorf("want ',' or %q, found %s", close, p.near())
		}
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, false, err
		}
		elems = append(elems, v)
		trailingComma = false
		if p.peek() == ',' {
			p.pos++
			trailingComma = true
		}
	}
}

func (p *parser) dict(depth int) (any, error) {
	if err := p.expect('{', "to open the dict"); err != nil {
		return nil, err
	}
	d := pyDict{vals: map[string]any{}}
	sep := true // a key may follow
	for {
		if p.peek() == '}' {
			p.pos++
			return d, nil
		}
		if !sep {
			return nil, p.errorf("want ',' or '}', found %s", p.near())
		}
		kpos := p.pos
		k, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		key, ok := k.(string)
		if !ok {
			p.pos = kpos
			return nil, p.errorf("dict key is %s, want a string", describe(k))
		}
		if _, dup := d.vals[key]; dup {
			p.pos = kpos
			return nil, p.errorf("duplicate key %s", quote(key))
		}
		if err := p.expect(':', "after key "+quote(key)); err != nil {
			return nil, err
		}
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		d.keys = append(d.keys, key)
		d.vals[key] = v
		sep = false
		if p.peek() == ',' {
			p.pos++
			sep = true
		}
	}
}

func (p *parser) str() (any, error) {
	q := p.src[p.pos]
	start := p.pos
	p.pos++
	var b strings.Builder
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		switch {
		case c == q:
			p.pos++
			return b.String(), nil
		case c == '\n':
			p.pos = start
			return nil, p.errorf("string not closed before end of line")
		case c == '\\' && p.pos+1 < len(p.src):
			// Escapes never appear in a supported dtype string; keep the escaped byte so that the
			// quote does not end the string, and let the dtype check reject the result.
			b.WriteByte(p.src[p.pos+1])
			p.pos += 2
		default:
			b.WriteByte(c)
			p.pos++
		}
	}
	p.pos = start
	return nil, p.errorf("string not closed")
}

func (p *parser) integer() (any, error) {
	start := p.pos
	if p.src[p.pos] == '-' {
		p.pos++
	}
	digits := p.pos
	for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
		p.pos++
	}
	if p.pos == digits {
		p.pos = start
		return nil, p.errorf("want an integer, found %s", p.near())
	}
	text := string(p.src[start:p.pos])
	if p.pos < len(p.src) && (p.src[p.pos] == 'L' || p.src[p.pos] == 'l') {
		p.pos++ // Python 2 long suffix
	}
	if p.pos < len(p.src) && (isIdent(p.src[p.pos]) || p.src[p.pos] == '.') {
		p.pos = start
		return nil, p.errorf("want an integer, found %s", p.near())
	}
	return pyInt(text), nil
}
