// Package dpcluster is the module's root. It holds no code: its tests check
// rules that span the whole repository, which no one package owns:
//
//   - no hand-written Go file is over 700 lines (TestFileLengths), so a
//     file keeps to one concern; the files still over are listed, to shrink;
//   - every design document cited in a Go comment or a Markdown file exists
//     in the repository (TestCitedDocumentsExist), so a clone has the whole
//     map;
//   - every package sits in one layer and imports only from its own or
//     lower ones (TestImportsPointDown; the layers are in layers_test.go
//     and docs/ARCHITECTURE.md).
//
// The map of the code is docs/ARCHITECTURE.md.
package dpcluster
