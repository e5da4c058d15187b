package blobcheck_test

import (
	"fmt"

	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/gdnkcp/gdnkcp/ptx/blobcheck"
)

// ExampleDiff compares the embedded blobs with themselves: every function of
// every target slot has the same code. With a freshly built blob directory as
// the second store, the functions whose Code is not CodeSame are the kernels
// the rebuild changed.
func ExampleDiff() {
	diffs, err := blobcheck.Diff(ptx.Embedded(), ptx.Embedded())
	if err != nil {
		fmt.Println(err)
		return
	}
	differ := 0
	for _, d := range diffs {
		if d.Code != blobcheck.CodeSame {
			differ++
		}
	}
	fmt.Println("functions compared:", len(diffs) > 0, "differing:", differ)
	// Output: functions compared: true differing: 0
}
