// Package dpcluster is the module's root. It holds no code: its tests check
// rules that span the whole repository, which no one package owns:
//
//   - no hand-written Go file is over 700 lines (TestFileLengths), so a
//     file keeps to one concern; the files still over are listed, to shrink;
//   - every design document cited in a Go comment or a Markdown file exists
//     in the repository (TestCitedDocumentsExist), so a clone has the whole
//     map.
//
// The map of the code is docs/ARCHITECTURE.md.
package dpcluster
