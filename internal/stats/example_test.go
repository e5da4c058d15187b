package stats_test

import (
	"fmt"

	"github.com/gdnkcp/gdnkcp/internal/stats"
)

func ExampleMedian() {
	fmt.Println(stats.Median([]float64{3.47, 3.44, 3.45, 3.52}))
	// Output: 3.46
}
