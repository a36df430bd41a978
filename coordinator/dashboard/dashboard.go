// Package dashboard serves a coordinator replica's live dashboard over
// HTTP: a page at / that shows the run (step, ε against the budget, δ,
// the accountant, evaluations of θ, round latency and participants, the
// nodes and the replicas) and updates itself every second, and the data
// it draws as JSON at /api/status (coordinator.Status) and /api/history
// (coordinator.History).
//
// The page is self-contained: its HTML, CSS and JavaScript are embedded in
// the binary (go:embed) and it loads nothing from elsewhere (no scripts,
// fonts or styles from a CDN; the Content-Security-Policy forbids it), so
// it works on machines without Internet access. Its charts are drawn on
// <canvas> by its own script.
//
// What it shows is what the Server publishes, all of it public (package
// coordinator, status.go): no per-node sum or example count, no training
// loss. Evaluations carry the label of their data (coordinator.EvalData),
// so one on rows held out of the private training data reads NON-PRIVATE.
//
// Use, next to the Prometheus metrics:
//
//	mux.Handle("/metrics", promhttp.Handler())
//	mux.Handle("/", dashboard.New(server)) // server: *coordinator.Server
package dashboard

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"

	"github.com/dpcluster/dpcluster/coordinator"
)

// Source is what the dashboard reads: *coordinator.Server implements it.
// Both methods must be safe to call from any goroutine and must not block.
type Source interface {
	Status() coordinator.Status
	History() coordinator.History
}

//go:embed assets
var assets embed.FS

// contentSecurityPolicy lets the page load only its own files and fetch
// only its own API.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// New returns the dashboard's handler for src. It serves GET (and HEAD)
// on / (the page), /dashboard.js, /dashboard.css, /api/status and
// /api/history, and 404 on any other path; mount it at the root of a mux.
func New(src Source) http.Handler {
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(static)
	mux := http.NewServeMux()
	page := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", contentSecurityPolicy)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	}
	mux.HandleFunc("GET /{$}", page)
	mux.HandleFunc("GET /dashboard.js", page)
	mux.HandleFunc("GET /dashboard.css", page)
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, src.Status())
	})
	mux.HandleFunc("GET /api/history", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, src.History())
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only a non-finite float can fail here: a bug upstream, not the
		// client's; say so without partial output.
		http.Error(w, "dashboard: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(append(b, '\n'))
}
