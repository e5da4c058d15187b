package blobcheck

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gdnkcp/gdnkcp/ptx"
)

// PTXModule is what ParsePTX reads from a PTX file.
type PTXModule struct {
	Version       Version  // the .version directive
	Target        string   // the first .target item, e.g. sm_80
	TargetOptions []string // further .target items, e.g. texmode_unified
	AddressSize   int      // the .address_size directive, 0 when absent
	// Entries lists every .entry declaration in file order, visible or not,
	// with or without a body.
	Entries []PTXEntry
	// Issues are the problems found while reading: text, header, syntax,
	// braces and truncation. A file nvcc wrote has none.
	Issues []Issue
}

// PTXEntry is one .entry declaration.
type PTXEntry struct {
	Name    string
	Line    int  // line of the .entry directive
	Visible bool // declared .visible
	HasBody bool // a { ... } body follows (a prototype ends with ;)
	// Params is the parameter list with offsets computed the way the driver
	// lays out the parameter buffer: each parameter at the next multiple of
	// its alignment (.align N, or the element size).
	Params  []ptx.Param
	MaxNTID []int // .maxntid, nil when absent
	ReqNTID []int // .reqntid, nil when absent
}

// Exported returns the entries a driver can look up: .visible and with a body.
func (m *PTXModule) Exported() []PTXEntry {
	var out []PTXEntry
	for _, e := range m.Entries {
		if e.Visible && e.HasBody {
			out = append(out, e)
		}
	}
	return out
}

// ptxTypeSize is the size in bytes of each PTX fundamental type a kernel
// parameter may have.
var ptxTypeSize = map[string]int{
	"b8": 1, "s8": 1, "u8": 1,
	"b16": 2, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
	"b32": 4, "s32": 4, "u32": 4, "f32": 4, "f16x2": 4, "bf16x2": 4,
	"b64": 8, "s64": 8, "u64": 8, "f64": 8,
}

// ParamTypeSize returns the element size of a parameter type as the manifest
// writes it (u64, s32, b8, ...).
func ParamTypeSize(typ string) (int, bool) {
	n, ok := ptxTypeSize[typ]
	return n, ok
}

// ParsePTX reads the header, the entries and their parameters from PTX text.
// It never fails: what it cannot read is reported in Issues, and everything
// it could read is returned.
func ParsePTX(data []byte) *PTXModule {
	m := &PTXModule{}
	text := checkText(data, m)
	stripped, err := stripComments(text)
	if err != nil {
		m.Issues = append(m.Issues, issuef(CheckPTXTruncated, "%v", err))
	}
	toks := lex(stripped)
	parseHeader(toks, m)
	parseEntries(toks, m)
	return m
}

// checkText reports NUL bytes other than one at the very end, invalid UTF-8
// and control characters, and returns the text without the final NUL.
func checkText(data []byte, m *PTXModule) string {
	if i := bytes.IndexByte(data, 0); i >= 0 {
		switch {
		case i != len(data)-1:
			m.Issues = append(m.Issues, issuef(CheckPTXText, "NUL byte at offset %d of %d (line %d): only one NUL, at the very end, is allowed",
				i, len(data), 1+bytes.Count(data[:i], []byte{'\n'})))
			data = data[:i]
		default:
			data = data[:i]
		}
	}
	if !utf8.Valid(data) {
		off := 0
		for off < len(data) {
			r, n := utf8.DecodeRune(data[off:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			off += n
		}
		m.Issues = append(m.Issues, issuef(CheckPTXText, "invalid UTF-8 at offset %d (line %d): PTX is text", off, 1+bytes.Count(data[:off], []byte{'\n'})))
	}
	for i, c := range data {
		if c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f' || c == 0x7f {
			m.Issues = append(m.Issues, issuef(CheckPTXText, "control byte %#02x at offset %d (line %d): PTX is text", c, i, 1+bytes.Count(data[:i], []byte{'\n'})))
			break
		}
	}
	return string(data)
}

// stripComments replaces // and /* */ comments by spaces, keeping newlines
// so that line numbers stay right, and leaves string literals alone.
func stripComments(s string) (string, error) {
	b := []byte(s)
	line := 1
	for i := 0; i < len(b); i++ {
		switch {
		case b[i] == '\n':
			line++
		case b[i] == '"':
			for i++; i < len(b) && b[i] != '"' && b[i] != '\n'; i++ {
				if b[i] == '\\' && i+1 < len(b) {
					i++
				}
			}
			if i < len(b) && b[i] == '\n' {
				line++
			}
		case b[i] == '/' && i+1 < len(b) && b[i+1] == '/':
			for ; i < len(b) && b[i] != '\n'; i++ {
				b[i] = ' '
			}
			if i < len(b) {
				line++
			}
		case b[i] == '/' && i+1 < len(b) && b[i+1] == '*':
			start := line
			b[i], b[i+1] = ' ', ' '
			i += 2
			for ; i < len(b) && !(b[i] == '*' && i+1 < len(b) && b[i+1] == '/'); i++ {
				if b[i] == '\n' {
					line++
				} else {
					b[i] = ' '
				}
			}
			if i >= len(b) {
				return string(b), fmt.Errorf("/* comment opened at line %d is never closed", start)
			}
			b[i], b[i+1] = ' ', ' '
			i++
		}
	}
	return string(b), nil
}

type token struct {
	text string
	line int
}

func isWordByte(c byte) bool {
	return c == '_' || c == '$' || c == '%' || c == '.' ||
		('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9')
}

// lex splits comment-free PTX into words (identifiers, directives,
// instructions and numbers, dots included), string literals and single
// punctuation characters.
func lex(s string) []token {
	var toks []token
	line := 1
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '\n':
			line++
			i++
		case c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f':
			i++
		case isWordByte(c):
			j := i
			for j < len(s) && isWordByte(s[j]) {
				j++
			}
			toks = append(toks, token{s[i:j], line})
			i = j
		case c == '"':
			j := i + 1
			for j < len(s) && s[j] != '"' && s[j] != '\n' {
				j++
			}
			if j < len(s) && s[j] == '"' {
				j++
			}
			toks = append(toks, token{s[i:j], line})
			i = j
		default:
			toks = append(toks, token{s[i : i+1], line})
			i++
		}
	}
	return toks
}

func parseHeader(toks []token, m *PTXModule) {
	idx := map[string]int{".version": -1, ".target": -1, ".address_size": -1}
	depth := 0
	for i, t := range toks {
		switch t.text {
		case "{":
			depth++
		case "}":
			depth--
		case ".version", ".target", ".address_size":
			if depth == 0 && idx[t.text] < 0 {
				idx[t.text] = i
			}
		}
	}
	missing := []string{}
	for _, d := range []string{".version", ".target", ".address_size"} {
		if idx[d] < 0 {
			missing = append(missing, d)
		}
	}
	if len(missing) > 0 {
		m.Issues = append(m.Issues, issuef(CheckPTXHeader, "missing %s (want .version, .target, .address_size 64 in that order)", strings.Join(missing, ", ")))
	}
	iv, it, ia := idx[".version"], idx[".target"], idx[".address_size"]
	if len(toks) > 0 && iv != 0 {
		m.Issues = append(m.Issues, issuef(CheckPTXHeader, "the file starts with %q at line %d, want .version first", toks[0].text, toks[0].line))
	}
	if iv >= 0 && it >= 0 && ia >= 0 && !(iv < it && it < ia) {
		m.Issues = append(m.Issues, issuef(CheckPTXHeader, ".version (line %d), .target (line %d), .address_size (line %d) are out of order",
			toks[iv].line, toks[it].line, toks[ia].line))
	}
	if iv >= 0 {
		if iv+1 >= len(toks) {
			m.Issues = append(m.Issues, issuef(CheckPTXHeader, ".version at line %d has no value", toks[iv].line))
		} else if v, err := ParseVersion(toks[iv+1].text); err != nil {
			m.Issues = append(m.Issues, issuef(CheckPTXHeader, "line %d: %v", toks[iv+1].line, err))
		} else {
			m.Version = v
		}
	}
	if it >= 0 {
		j := it + 1
		for ; j < len(toks) && toks[j].line == toks[it].line; j++ {
			if toks[j].text == "," {
				continue
			}
			if m.Target == "" {
				m.Target = toks[j].text
			} else {
				m.TargetOptions = append(m.TargetOptions, toks[j].text)
			}
		}
		if m.Target == "" {
			m.Issues = append(m.Issues, issuef(CheckPTXHeader, ".target at line %d has no value", toks[it].line))
		}
	}
	if ia >= 0 {
		if ia+1 < len(toks) {
			if n, err := strconv.Atoi(toks[ia+1].text); err == nil {
				m.AddressSize = n
			}
		}
		if m.AddressSize != 64 {
			val := "nothing"
			if ia+1 < len(toks) {
				val = strconv.Quote(toks[ia+1].text)
			}
			m.Issues = append(m.Issues, issuef(CheckPTXHeader, ".address_size at line %d is %s, want 64", toks[ia].line, val))
		}
	}
}

// parseEntries walks the top level of the module, reads every .entry and
// checks that braces balance and that the text ends with the last }.
func parseEntries(toks []token, m *PTXModule) {
	depth := 0
	stmtStart := 0 // first token of the current top-level statement
	for i := 0; i < len(toks); {
		t := toks[i]
		switch {
		case t.text == "{":
			depth++
		case t.text == "}":
			depth--
			if depth < 0 {
				m.Issues = append(m.Issues, issuef(CheckPTXBraces, "} at line %d closes nothing", t.line))
				depth = 0
			}
			if depth == 0 {
				stmtStart = i + 1
			}
		case t.text == ";" && depth == 0:
			stmtStart = i + 1
		case t.text == ".entry" && depth == 0:
			visible := false
			for _, p := range toks[stmtStart:i] {
				if p.text == ".visible" {
					visible = true
				}
			}
			e, next, closed := parseEntry(toks, i, m)
			e.Visible = visible
			m.Entries = append(m.Entries, e)
			if !closed {
				depth = 1 // the body never closed: the brace check reports it
				i = next
				continue
			}
			stmtStart = next
			i = next
			continue
		}
		i++
	}
	if depth > 0 {
		m.Issues = append(m.Issues, issuef(CheckPTXBraces, "%d { never closed", depth))
	}
	if len(toks) == 0 {
		m.Issues = append(m.Issues, issuef(CheckPTXTruncated, "no PTX text"))
		return
	}
	if last := toks[len(toks)-1]; last.text != "}" {
		m.Issues = append(m.Issues, issuef(CheckPTXTruncated, "the text ends with %q at line %d, want the closing } of the last function", last.text, last.line))
	}
}

// parseEntry reads ".entry name (params) directives { body }" starting at
// toks[i] == ".entry". It returns the entry, the index after it, and whether
// its body (if any) was closed.
func parseEntry(toks []token, i int, m *PTXModule) (PTXEntry, int, bool) {
	e := PTXEntry{Line: toks[i].line}
	j := i + 1
	if j >= len(toks) || !isIdent(toks[j].text) {
		m.Issues = append(m.Issues, issuef(CheckPTXSyntax, ".entry at line %d has no name", toks[i].line))
		return e, j, true
	}
	e.Name = toks[j].text
	j++
	if j < len(toks) && toks[j].text == "(" {
		k := j + 1
		for k < len(toks) && toks[k].text != ")" && toks[k].text != "{" && toks[k].text != "(" {
			k++
		}
		if k >= len(toks) || toks[k].text != ")" {
			m.Issues = append(m.Issues, issuef(CheckPTXSyntax, "entry %s (line %d): parameter list is not closed", e.Name, e.Line))
			return e, k, true
		}
		e.Params = parseParams(e.Name, toks[j+1:k], m)
		j = k + 1
	}
	// Performance directives up to the body or the ; of a prototype.
	for j < len(toks) && toks[j].text != "{" && toks[j].text != ";" {
		switch d := toks[j].text; d {
		case ".maxntid", ".reqntid":
			var dims []int
			k := j + 1
			for k < len(toks) {
				n, err := strconv.Atoi(toks[k].text)
				if err != nil {
					break
				}
				dims = append(dims, n)
				k++
				if k < len(toks) && toks[k].text == "," {
					k++
					continue
				}
				break
			}
			if len(dims) == 0 || len(dims) > 3 {
				m.Issues = append(m.Issues, issuef(CheckPTXSyntax, "entry %s: %s at line %d needs 1 to 3 dimensions", e.Name, d, toks[j].line))
			}
			if d == ".maxntid" {
				e.MaxNTID = dims
			} else {
				e.ReqNTID = dims
			}
			j = k
		default:
			j++
		}
	}
	if j >= len(toks) {
		return e, j, true // the truncation check reports the missing body
	}
	if toks[j].text == ";" {
		return e, j + 1, true
	}
	depth := 0
	for k := j; k < len(toks); k++ {
		switch toks[k].text {
		case "{":
			depth++
		case "}":
			depth--
			if depth == 0 {
				e.HasBody = true
				return e, k + 1, true
			}
		}
	}
	return e, len(toks), false
}

func isIdent(s string) bool {
	if s == "" || s[0] == '.' || ('0' <= s[0] && s[0] <= '9') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isWordByte(s[i]) || s[i] == '.' {
			return false
		}
	}
	return true
}

// splitDirectives turns ".ptr.global.align" into ".ptr", ".global", ".align".
func splitDirectives(toks []token) []token {
	var out []token
	for _, t := range toks {
		if strings.HasPrefix(t.text, ".") && strings.Count(t.text, ".") > 1 {
			for _, p := range strings.Split(t.text[1:], ".") {
				out = append(out, token{"." + p, t.line})
			}
			continue
		}
		out = append(out, t)
	}
	return out
}

// parseParams reads ".param [.align N] .type [.ptr [.space] [.align N]] name[N]"
// declarations separated by commas.
func parseParams(entry string, toks []token, m *PTXModule) []ptx.Param {
	var params []ptx.Param
	end := 0
	var groups [][]token
	cur := []token{}
	for _, t := range toks {
		if t.text == "," {
			groups = append(groups, cur)
			cur = []token{}
			continue
		}
		cur = append(cur, t)
	}
	if len(cur) > 0 || len(groups) > 0 {
		groups = append(groups, cur)
	}
	for n, g := range groups {
		g = splitDirectives(g)
		bad := func(why string) {
			line := 0
			if len(g) > 0 {
				line = g[0].line
			}
			m.Issues = append(m.Issues, issuef(CheckPTXSyntax, "entry %s parameter %d (line %d): %s", entry, n, line, why))
		}
		if len(g) == 0 || g[0].text != ".param" {
			bad("want .param")
			return params
		}
		p := ptx.Param{}
		elem, count := 0, 1
		k := 1
		pointer := false
		for ; k < len(g); k++ {
			t := g[k].text
			if t == ".align" {
				if k+1 >= len(g) {
					bad(".align without a value")
					return params
				}
				a, err := strconv.Atoi(g[k+1].text)
				if err != nil || a <= 0 || a&(a-1) != 0 {
					bad(fmt.Sprintf(".align %s is not a power of two", g[k+1].text))
					return params
				}
				if !pointer {
					p.Align = a // the parameter's own alignment; after .ptr it is the pointee's
				}
				k++
				continue
			}
			if t == ".ptr" {
				pointer = true
				continue
			}
			if pointer && (t == ".global" || t == ".const" || t == ".local" || t == ".shared") {
				continue
			}
			if strings.HasPrefix(t, ".") {
				size, ok := ptxTypeSize[t[1:]]
				if !ok || p.Type != "" {
					bad(fmt.Sprintf("unexpected %s", t))
					return params
				}
				p.Type, elem = t[1:], size
				continue
			}
			break
		}
		if p.Type == "" {
			bad("no type")
			return params
		}
		if k >= len(g) || !isIdent(g[k].text) {
			bad("no name")
			return params
		}
		p.Name = g[k].text
		k++
		if k < len(g) && g[k].text == "[" {
			if k+2 >= len(g) || g[k+2].text != "]" {
				bad("array length is not [N]")
				return params
			}
			c, err := strconv.Atoi(g[k+1].text)
			if err != nil || c <= 0 {
				bad(fmt.Sprintf("array length %q", g[k+1].text))
				return params
			}
			count = c
			k += 3
		}
		if k != len(g) {
			bad(fmt.Sprintf("unexpected %q after the name", g[k].text))
			return params
		}
		if p.Align == 0 {
			p.Align = elem
		}
		p.Size = elem * count
		p.Offset = alignUp(end, p.Align)
		end = p.Offset + p.Size
		params = append(params, p)
	}
	return params
}

func alignUp(n, a int) int {
	if a <= 1 {
		return n
	}
	return (n + a - 1) / a * a
}

// LayoutError checks that a parameter list is laid out the way the driver
// does it: known types, sizes a whole number of elements, power-of-two
// alignments no smaller than the element, and each offset the first multiple
// of the alignment after the previous parameter. It returns nil when it is.
func LayoutError(params []ptx.Param) error {
	end := 0
	for i, p := range params {
		elem, ok := ptxTypeSize[p.Type]
		switch {
		case !ok:
			return fmt.Errorf("parameter %d (%s): unknown type %q", i, p.Name, p.Type)
		case p.Size <= 0 || p.Size%elem != 0:
			return fmt.Errorf("parameter %d (%s): size %d is not a whole number of %s", i, p.Name, p.Size, p.Type)
		case p.Align <= 0 || p.Align&(p.Align-1) != 0 || p.Align < elem:
			return fmt.Errorf("parameter %d (%s): alignment %d is not a power of two of at least %d", i, p.Name, p.Align, elem)
		case p.Offset != alignUp(end, p.Align):
			return fmt.Errorf("parameter %d (%s): offset %d, want %d (after %d bytes, aligned to %d)", i, p.Name, p.Offset, alignUp(end, p.Align), end, p.Align)
		}
		end = p.Offset + p.Size
	}
	return nil
}
