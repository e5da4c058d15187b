package loader_test

import (
	"errors"
	"fmt"

	"github.com/gdnkcp/gdnkcp/loader"
)

// The example lists the GPUs, or says that there is no driver.
func Example() {
	n, err := loader.DeviceCount()
	if errors.Is(err, loader.ErrNoDriver) {
		fmt.Println("no CUDA driver")
		return
	}
	if err != nil {
		fmt.Println("CUDA unavailable:", err)
		return
	}
	for i := range n {
		dev, err := loader.GetDevice(i)
		if err != nil {
			fmt.Println(err)
			return
		}
		name, _ := dev.Name()
		major, minor, _ := dev.ComputeCapability()
		sms, _ := dev.SMCount()
		fmt.Printf("GPU %d: %s, compute capability %d.%d, %d SMs\n", i, name, major, minor, sms)
	}
}

// Launching a kernel: load PTX, look up the entry, give it its signature,
// build arguments and launch.
func ExampleLaunch() {
	ctx, err := loader.Primary(0)
	if err != nil {
		fmt.Println("no GPU:", errors.Is(err, loader.ErrNoDriver))
		return
	}
	defer ctx.Close()
	ptx := []byte(".version 8.0\n.target sm_80\n.address_size 64\n" +
		".visible .entry fill(.param .u64 p, .param .u32 v)\n{\n" +
		"\t.reg .b32 %r<3>;\n\t.reg .b64 %rd<4>;\n" +
		"\tld.param.u64 %rd1, [p];\n\tld.param.u32 %r1, [v];\n" +
		"\tmov.u32 %r2, %tid.x;\n\tcvta.to.global.u64 %rd2, %rd1;\n" +
		"\tmul.wide.u32 %rd3, %r2, 4;\n\tadd.s64 %rd2, %rd2, %rd3;\n" +
		"\tst.global.u32 [%rd2], %r1;\n\tret;\n}\n")
	mod, err := loader.LoadModule(ctx, ptx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mod.Close()
	fill, err := mod.Function("fill")
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := fill.SetSignature([]loader.ParamSpec{{Name: "p", Size: 8, Align: 8}, {Name: "v", Size: 4, Align: 4, Offset: 8}}); err != nil {
		fmt.Println(err)
		return
	}
	buf, err := loader.AllocFor[uint32](ctx, 32)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer buf.Free()
	if err := loader.Launch(nil, fill, [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, loader.NewArgs().Ptr(buf).U32(42)); err != nil {
		fmt.Println(err)
		return
	}
	out := make([]uint32, 32)
	if err := loader.CopyFromDevice(buf, out); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(out[0], out[31])
}

// A kernel that takes another's arguments and two more: the clone grows, the
// original keeps its layout.
func ExampleArgs_Clone() {
	base := loader.NewArgs().DevicePtr(0x1000).I32(64)
	more := base.Clone().DevicePtr(0x2000).I32(2)
	fmt.Println(base.Len(), base.Size())
	fmt.Println(more.Len(), more.Size())
	// Output:
	// 2 12
	// 4 28
}
