package durable_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/dpcluster/dpcluster/internal/durable"
)

// Replace writes a file so that a crash leaves the old contents or the
// new; Create does the same for a file that must not exist yet.
func Example() {
	dir, err := os.MkdirTemp("", "durable-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "state.json")

	write := func(s string) func(*os.File) error {
		return func(f *os.File) error {
			_, err := f.WriteString(s)
			return err
		}
	}
	if err := durable.Create(path, 0o644, write(`{"step": 1}`)); err != nil {
		panic(err)
	}
	err = durable.Create(path, 0o644, write(`{"step": 0}`))
	fmt.Println("create over an existing file:", errors.Is(err, fs.ErrExist))

	if err := durable.Replace(path, 0o644, write(`{"step": 2}`)); err != nil {
		panic(err)
	}
	// A writer that fails leaves the file as it was.
	_ = durable.Replace(path, 0o644, func(*os.File) error { return errors.New("disk full") })
	b, _ := os.ReadFile(path)
	fmt.Println(string(b))
	// Output:
	// create over an existing file: true
	// {"step": 2}
}
