package cli

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// envPrefix begins the environment variable of each node flag: the flag's
// name in capitals, '-' as '_', after it (--label-column is
// DPC_LABEL_COLUMN). A systemd unit or a container sets a node's flags
// through its environment file this way, where it cannot leave a flag
// out or give it an empty value on its command line.
const envPrefix = "DPC_"

// envName is the environment variable of the flag named flag.
func envName(flag string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// applyEnv sets each flag of fs that the command line did not set from
// its environment variable (envName), if environ (os.Environ's form)
// holds it, also when its value is empty: DPC_LABEL_COLUMN= says "no
// label column" (a headerless CSV) even where the run file names one.
// Flags so set count as given (Changed), so loadRunSpec applies them over
// the run file: flags win over the environment, which wins over the run
// file. A DPC_ variable that names no flag, or holds a value its flag
// refuses, is an error naming it.
func applyEnv(fs *pflag.FlagSet, environ []string) error {
	flags := make(map[string]*pflag.Flag)
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != "help" {
			flags[envName(f.Name)] = f
		}
	})
	environ = slices.Sorted(slices.Values(environ))
	var errs []error
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) {
			continue
		}
		f, ok := flags[name]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("environment variable %s names no flag (--%s): a flag's variable is %s and its name in capitals, - as _",
				name, strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, envPrefix), "_", "-")), envPrefix))
		case f.Changed: // the command line wins
		default:
			if err := fs.Set(f.Name, value); err != nil {
				errs = append(errs, fmt.Errorf("environment variable %s=%s (--%s): %w", name, value, f.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}
