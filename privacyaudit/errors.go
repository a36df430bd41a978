package privacyaudit

import "errors"

// ErrInvalid is returned, wrapped with the offending values, for counts or
// parameters outside their ranges: r < 1, r > m, r > MaxGuesses, v outside
// [0, r], δ outside [0, 1), β outside (0, 1), a NaN anywhere, and for
// Guess, mismatched lengths, negative or too many guesses and NaN scores.
// Test for it with errors.Is.
var ErrInvalid = errors.New("privacyaudit: invalid argument")
