package comm_test

import (
	"context"
	"fmt"

	"github.com/gdnkcp/gdnkcp/comm"
)

func ExampleNewLoopback() {
	comms, err := comm.NewLoopback(2)
	if err != nil {
		fmt.Println(err)
		return
	}
	got := make([][]float64, len(comms))
	err = comm.RunRanks(context.Background(), comms, func(ctx context.Context, c comm.Communicator) error {
		// Each rank contributes two values; every rank receives all of them in rank order.
		send := []float64{float64(c.Rank()), 10 * float64(c.Rank()+1)}
		recv, err := comm.AllGatherFloat64(ctx, c, send)
		got[c.Rank()] = recv
		return err
	})
	fmt.Println("error:", err)
	for r, v := range got {
		fmt.Printf("rank %d: %v\n", r, v)
	}
	// Output:
	// error: <nil>
	// rank 0: [0 10 1 20]
	// rank 1: [0 10 1 20]
}
