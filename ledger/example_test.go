package ledger_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/seed"
)

// A run's ledger: the run record binds it to a target ε = 1 at δ = 1e-5
// and the RDP accountant; each charge is durable before Charge returns,
// and the charge that would pass the target is refused.
func Example() {
	dir, err := os.MkdirTemp("", "ledger")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	l, err := ledger.Open(filepath.Join(dir, "ledger.log"))
	if err != nil {
		panic(err)
	}
	defer l.Close()
	const history = "0123456789abcdef0123456789abcdef"
	if err := l.Start("example", 1, 1e-5, seed.Crypto, ledger.MechanismFloat, ledger.AccountantRDP, history); err != nil {
		panic(err)
	}
	step := accounting.SubsampledGaussian(0.1, 2)
	for i := int64(1); ; i++ {
		pos := ledger.Position{History: history, Term: 1, Index: uint64(i)}
		if _, err := l.Charge(i, step, pos, false); errors.Is(err, ledger.ErrBudgetExceeded) {
			fmt.Printf("step %d refused; %d charged, ε = %.4f\n", i, l.Charges(), l.Spent())
			break
		} else if err != nil {
			panic(err)
		}
	}
	// Output: step 12 refused; 11 charged, ε = 0.9682
}
