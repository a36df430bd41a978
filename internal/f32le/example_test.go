package f32le_test

import (
	"fmt"

	"github.com/dpcluster/dpcluster/internal/f32le"
)

func Example() {
	b := f32le.Append(nil, []float32{1, -2})
	fmt.Printf("% x\n", b)
	v := make([]float32, 2)
	f32le.Get(v, b)
	fmt.Println(v)
	// Output:
	// 00 00 80 3f 00 00 00 c0
	// [1 -2]
}
