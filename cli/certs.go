package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dpcluster/dpcluster/pki"
)

func newCertsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Create the run's certificates (one CA, one certificate per replica, node and observer)",
	}
	cmd.AddCommand(newCertsInitCmd())
	return cmd
}

func newCertsInitCmd() *cobra.Command {
	var (
		dir                        string
		replicas, nodes, observers []string
		hosts                      []string
		days                       int
		bundles                    bool
	)
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Write a CA and a certificate and key for every replica, node and observer",
		Long: `init writes DIR/ca.crt and DIR/ca.key and, for every ID given, DIR/ID.crt and DIR/ID.key
(ECDSA P-256; keys PKCS#8 PEM, mode 0600). A certificate names its holder's role and ID in a
URI SAN dpcluster://ROLE/ID, its CommonName (ID) and OrganizationalUnit (ROLE); docs/SECURITY.md
says what a certificate from your own CA must contain. Every certificate is valid for localhost,
127.0.0.1, ::1 and --hosts.

If DIR already holds ca.crt and ca.key, init issues the IDs given with that CA, so that a node
can be added later. It never overwrites a file: an ID whose files exist is refused, and nothing
is written. Copy each ID's two files and ca.crt (never ca.key) to that machine.

With --bundles init also writes, for every ID it issues, the folder DIR/hosts/ID/ (mode 0700)
holding exactly what that machine needs: ca.crt, ID.crt and ID.key (mode 0600), never ca.key.
Copy the folder's contents to the machine (deploy/README.md). An ID whose folder exists is
refused too, before anything is written; a later init with --bundles adds only the new IDs'
folders.`,
		Example: `  coordinator certs init --dir certs --replicas r1,r2,r3 --nodes node-0,node-1,node-2 \
      --observers ops --hosts 10.0.0.1,10.0.0.2,10.0.0.3,coord.example.com
  coordinator certs init --dir certs --nodes node-3    # later: one more node, same CA
  coordinator certs init --dir certs --bundles --replicas r1,r2,r3 --nodes node-0,node-1 \
      --hosts 10.0.0.1,10.0.0.2,10.0.0.3               # and certs/hosts/ID/ per machine`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return errors.New("--dir is required")
			}
			var names []pki.Name
			for _, g := range []struct {
				flag string
				role pki.Role
				ids  []string
			}{{"--replicas", pki.RoleReplica, replicas}, {"--nodes", pki.RoleNode, nodes}, {"--observers", pki.RoleObserver, observers}} {
				for _, id := range g.ids {
					if !pki.ValidID(id) || id == "ca" {
						return fmt.Errorf("%s: invalid ID %q: want 1 to 64 characters of [A-Za-z0-9_-], not \"ca\"", g.flag, id)
					}
					names = append(names, pki.Name{Role: g.role, ID: id})
				}
			}
			if len(names) == 0 {
				return errors.New("no IDs: give --replicas, --nodes or --observers")
			}
			if len(replicas) == 0 && !pki.HasCA(dir) {
				return fmt.Errorf("--replicas is required when %s holds no CA yet", dir)
			}
			for i, h := range hosts {
				hosts[i] = strings.TrimSpace(h)
			}
			if bundles {
				for _, n := range names {
					if err := pki.CheckBundleFree(dir, n.ID); err != nil {
						return err
					}
				}
			}
			written, err := pki.Init(dir, names, hosts, days)
			for i := 0; bundles && err == nil && i < len(names); i++ {
				var w []string
				w, err = pki.WriteBundle(dir, names[i].ID)
				written = append(written, w...)
			}
			for _, p := range written {
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %s\n", p)
			}
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&dir, "dir", "", "directory for the certificates and keys (required; created mode 0700)")
	fs.StringSliceVar(&replicas, "replicas", nil, "coordinator replica IDs, comma-separated (required for a new CA)")
	fs.StringSliceVar(&nodes, "nodes", nil, "node IDs, comma-separated")
	fs.StringSliceVar(&observers, "observers", nil, "observer IDs (operators' tools), comma-separated")
	fs.StringSliceVar(&hosts, "hosts", nil, "DNS names and IP addresses of the machines, comma-separated, put in every certificate besides localhost and 127.0.0.1")
	fs.BoolVar(&bundles, "bundles", false, "also write DIR/hosts/ID/ per ID: ca.crt, ID.crt and ID.key, what that machine needs (never ca.key)")
	fs.IntVar(&days, "days", 365, "validity of the certificates in days (a new CA: max(days, 10 years))")
	return cmd
}
