package checkpoint

// F16ToF32ForTest exposes the binary16 conversion to the external tests.
var F16ToF32ForTest = f16ToF32
