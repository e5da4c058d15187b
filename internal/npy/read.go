package npy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"slices"
)

// Read reads one .npy array from r, which must hold exactly that array: bytes after the data are an
// error. Errors are [*Error] values without a file name; use [ReadFile] to have them name the file.
func Read(r io.Reader) (*Array, error) {
	return read(r, "", -1)
}

// ReadFile reads the .npy file at path. Errors name the file; the returned Array's Name is path.
func ReadFile(path string) (*Array, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, ioError(path, "cannot open", err)
	}
	defer f.Close()
	size := int64(-1)
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		size = st.Size()
	}
	return read(bufio.NewReaderSize(f, 1<<16), path, size)
}

// ioError wraps an I/O error, dropping the path an *fs.PathError repeats.
func ioError(file, msg string, err error) *Error {
	var pe *fs.PathError
	if file != "" && errors.As(err, &pe) {
		err = pe.Err
	}
	return &Error{File: file, Kind: ErrIO, Msg: msg, Err: err}
}

// read reads an array; size is the total size of the input when known, else -1.
func read(r io.Reader, file string, size int64) (*Array, error) {
	var pre [12]byte
	n, err := io.ReadFull(r, pre[:8])
	if err != nil && !isEOF(err) {
		return nil, ioError(file, "reading the npy preamble", err)
	}
	if !bytes.HasPrefix([]byte(magic), pre[:min(n, len(magic))]) {
		return nil, newError(file, ErrMagic, "bad magic %q, want %q (not an npy file)", pre[:min(n, len(magic))], magic)
	}
	if n < 8 {
		return nil, newError(file, ErrTruncated, "file ends after %d bytes, inside the preamble (magic, version, header length: at least 10 bytes)", n)
	}
	major, minor := pre[6], pre[7]
	if major < 1 || major > 3 || minor != 0 {
		return nil, newError(file, ErrVersion, "format version %d.%d, want 1.0, 2.0 or 3.0", major, minor)
	}
	lenSize := 2
	if major > 1 {
		lenSize = 4
	}
	if m, err := io.ReadFull(r, pre[8:8+lenSize]); err != nil {
		if !isEOF(err) {
			return nil, ioError(file, "reading the header length", err)
		}
		return nil, newError(file, ErrTruncated, "file ends after %d bytes, inside the %d-byte header length of format %d.0", 8+m, lenSize, major)
	}
	var hlen int
	if lenSize == 2 {
		hlen = int(le.Uint16(pre[8:]))
	} else {
		hlen = int(le.Uint32(pre[8:]))
	}
	if hlen > maxHeaderLen {
		return nil, newError(file, ErrHeader, "header length %d bytes, want at most %d", hlen, maxHeaderLen)
	}
	text, err := readN(r, hlen)
	if err != nil {
		if !isEOF(err) {
			return nil, ioError(file, "reading the header", err)
		}
		return nil, newError(file, ErrTruncated, "file ends %d bytes into a %d-byte header", len(text), hlen)
	}
	h, err := parseHeader(file, text)
	if err != nil {
		return nil, err
	}
	what := func() string { return "shape " + formatShape(h.shape) + " of " + quote(h.dtype) }

	consumed := int64(8 + lenSize + hlen)
	if size >= 0 {
		switch have := size - consumed; {
		case have < int64(h.nbytes):
			return nil, newError(file, ErrTruncated, "truncated file: %d data bytes, want %d for %s", have, h.nbytes, what())
		case have > int64(h.nbytes):
			return nil, newError(file, ErrTrailingData, "%d trailing bytes after the data (%s needs %d bytes)", have-int64(h.nbytes), what(), h.nbytes)
		}
	}
	data, err := readN(r, h.nbytes)
	if err != nil {
		if !isEOF(err) {
			return nil, ioError(file, "reading the data", err)
		}
		return nil, newError(file, ErrTruncated, "truncated file: %d data bytes, want %d for %s", len(data), h.nbytes, what())
	}
	extra, err := io.Copy(io.Discard, r)
	if err != nil {
		return nil, ioError(file, "reading after the data", err)
	}
	if extra > 0 {
		return nil, newError(file, ErrTrailingData, "%d trailing bytes after the data (%s needs %d bytes)", extra, what(), h.nbytes)
	}
	return &Array{Shape: h.shape, Dtype: h.dtype, Name: file, data: data}, nil
}

func isEOF(err error) bool {
	return err == io.EOF || err == io.ErrUnexpectedEOF
}

// readN reads exactly n bytes, growing its buffer as data arrives so that a header claiming a huge size
// costs memory only when the bytes are really there. On a short read it returns what it got and
// io.ErrUnexpectedEOF.
func readN(r io.Reader, n int) ([]byte, error) {
	const step = 16 << 20
	buf := make([]byte, 0, min(n, step))
	for len(buf) < n {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(n-len(buf), max(len(buf), step)))
		}
		m, err := io.ReadFull(r, buf[len(buf):min(cap(buf), n)])
		buf = buf[:len(buf)+m]
		if err != nil {
			if isEOF(err) {
				err = io.ErrUnexpectedEOF
			}
			return buf, err
		}
	}
	return buf, nil
}
