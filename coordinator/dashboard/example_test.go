package dashboard_test

import (
	"fmt"
	"io"
	"net/http/httptest"

	"github.com/dpcluster/dpcluster/coordinator/dashboard"
)

// Serve the dashboard of a Source (a *coordinator.Server in a replica) and
// read its status as JSON.
func ExampleNew() {
	srv := httptest.NewServer(dashboard.New(fullSource()))
	defer srv.Close()
	res, err := srv.Client().Get(srv.URL + "/api/status")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	fmt.Println(res.Header.Get("Content-Type"), string(b[:39]))
	// Output: application/json {"run":"r","replica":"r1","role":"leade
}
