package accounting

import "errors"

// Errors returned by the accountants, event validation and decoding. Test
// for them with errors.Is: the returned errors wrap them with details.
var (
	// ErrInvalidParameter is returned for a δ, ε, q, σ, Rényi order, step
	// count or accountant name outside its valid range.
	ErrInvalidParameter = errors.New("accounting: invalid parameter")
	// ErrUnreachable is returned by calibration when no noise multiplier in
	// the searched range reaches the target ε.
	ErrUnreachable = errors.New("accounting: target epsilon unreachable")
	// ErrInvalidEvent is returned for an event whose parameters are out of
	// range or whose structure is not one the accountant knows, and by the
	// PLD accountant for an event it cannot charge.
	ErrInvalidEvent = errors.New("accounting: invalid privacy event")
	// ErrEventFormat is returned when decoding an event of an unknown format
	// version.
	ErrEventFormat = errors.New("accounting: unknown privacy event format")
)
