package procstat_test

import (
	"errors"
	"fmt"

	"github.com/dpcluster/dpcluster/internal/procstat"
)

// PeakRSS is the most memory this process has held; on a system without
// /proc/self/status it returns ErrUnavailable.
func Example() {
	rss, err := procstat.RSS() // first: the peak read after it is at least this
	switch {
	case errors.Is(err, procstat.ErrUnavailable):
		fmt.Println("no /proc on this system")
	case err != nil:
		panic(err)
	default:
		peak, _ := procstat.PeakRSS()
		fmt.Println("peak at least the current:", peak >= rss && rss > 0)
	}
	// Output: peak at least the current: true
}
