package npy_test

import (
	"bytes"
	"fmt"

	"github.com/gdnkcp/gdnkcp/internal/npy"
)

func Example() {
	var buf bytes.Buffer
	if err := npy.Write(&buf, []int{2, 3}, []float32{1, 2, 3, 4, 5, 6}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d bytes, header %q\n", buf.Len(), buf.String()[10:69])

	a, err := npy.Read(&buf)
	if err != nil {
		fmt.Println(err)
		return
	}
	v, err := a.Float64() // '<f4' widened exactly
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(a.Shape, a.Dtype, v)
	fmt.Println(npy.ExpectShape(a, "q.npy", []int{2, 3}, "T, K"))
	fmt.Println(npy.ExpectShape(a, "q.npy", []int{4, 3}, "T, K"))
	// Output:
	// 152 bytes, header "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
	// [2 3] <f4 [1 2 3 4 5 6]
	// <nil>
	// q.npy: shape (2, 3), want (4, 3) [T, K]
}
