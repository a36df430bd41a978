package cli

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/dpcluster/dpcluster/pki"
)

// The multi-machine deployment files of deploy/ (deploy/README.md): per
// role a compose file and a systemd unit, filled from one env file per
// machine. These tests hold them to the binaries: every flag exists, the
// certificate files are those `certs init --bundles` writes, every
// variable is defined.

var deployDir = filepath.Join("..", "deploy")

// deployVarRE matches a variable reference, ${NAME} or $NAME; envNameRE a
// name hosts.env.example may define.
var (
	deployVarRE = regexp.MustCompile(`\$(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)`)
	envNameRE   = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)
)

// deployEnv reads deploy/hosts.env.example: NAME=value lines and whole-line
// comments, the syntax compose's --env-file and systemd's EnvironmentFile=
// both read the same way (no quotes, no comment after a value).
func deployEnv(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployDir, "hosts.env.example"))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok || !envNameRE.MatchString(name) || value == "" ||
			strings.ContainsAny(value, "\"'#$ \t") {
			t.Errorf("hosts.env.example:%d: %q is not NAME=value (a plain value, no quotes, spaces or comment)", n, line)
			continue
		}
		if _, dup := env[name]; dup {
			t.Errorf("hosts.env.example:%d: %s defined twice", n, name)
		}
		env[name] = value
	}
	return env
}

// deployCommand is one process's command line in a deploy file.
type deployCommand struct {
	file    string   // under deploy/
	role    string   // "replica" or "node"
	args    []string // after the program (coordinator's start with its subcommand), ${NAME}s unexpanded
	volumes []string // compose: the service's volumes
	// systemd: the [Service] settings; compose: the service's image, user,
	// network_mode and restart.
	settings map[string][]string
}

// composeService is what the tests read of a compose service.
type composeService struct {
	Image       string   `yaml:"image"`
	User        string   `yaml:"user"`
	NetworkMode string   `yaml:"network_mode"`
	Restart     string   `yaml:"restart"`
	Command     []string `yaml:"command"`
	Volumes     []string `yaml:"volumes"`
}

// deployCommands returns the commands of deploy/compose/*.yml and
// deploy/systemd/*.service, each file's one process, compose first.
func deployCommands(t *testing.T) []deployCommand {
	t.Helper()
	var out []deployCommand
	roleOf := func(file string, argv []string) (string, []string) {
		t.Helper()
		switch {
		case len(argv) > 1 && filepath.Base(argv[0]) == "coordinator" && argv[1] == "serve":
			return "replica", argv[1:]
		case len(argv) > 0 && filepath.Base(argv[0]) == "node":
			return "node", argv[1:]
		}
		t.Fatalf("%s runs %q, neither coordinator serve nor node", file, argv)
		return "", nil
	}
	for _, name := range []string{"replica.yml", "node.yml"} {
		file := filepath.Join("compose", name)
		data, err := os.ReadFile(filepath.Join(deployDir, file))
		if err != nil {
			t.Fatal(err)
		}
		var c struct {
			Services map[string]composeService `yaml:"services"`
		}
		if err := yaml.Unmarshal(data, &c); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(c.Services) != 1 {
			t.Fatalf("%s: %d services, want the one process of its role", file, len(c.Services))
		}
		for _, svc := range c.Services {
			role, args := roleOf(file, svc.Command)
			out = append(out, deployCommand{file: file, role: role, args: args, volumes: svc.Volumes, settings: map[string][]string{
				"image": {svc.Image}, "user": {svc.User}, "network_mode": {svc.NetworkMode}, "restart": {svc.Restart}}})
		}
	}
	for _, name := range []string{"dpcluster-replica.service", "dpcluster-node.service"} {
		file := filepath.Join("systemd", name)
		settings := systemdServiceSettings(t, file)
		execs := settings["ExecStart"]
		if len(execs) != 1 {
			t.Fatalf("%s: %d ExecStart lines, want 1", file, len(execs))
		}
		if strings.ContainsAny(execs[0], `"'`) {
			t.Errorf("%s: ExecStart has quotes; the tests split it on spaces", file)
		}
		role, args := roleOf(file, strings.Fields(execs[0]))
		out = append(out, deployCommand{file: file, role: role, args: args, settings: settings})
	}
	return out
}

// systemdServiceSettings reads the [Service] section of a unit under
// deploy/: its settings by name, in order, continuation lines joined.
func systemdServiceSettings(t *testing.T, file string) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployDir, file))
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string][]string{}
	section, pending := "", ""
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if pending == "" && (line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";")) {
			continue
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			pending += cont + " "
			continue
		}
		line, pending = pending+line, ""
		if strings.HasPrefix(line, "[") {
			section = line
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Errorf("%s: %q is not a setting", file, line)
			continue
		}
		if section == "[Service]" {
			settings[k] = append(settings[k], v)
		}
	}
	return settings
}

// expandDeploy replaces every ${NAME} and $NAME in s with env's value; an
// undefined name fails the test.
func expandDeploy(t *testing.T, where, s string, env map[string]string) string {
	t.Helper()
	return deployVarRE.ReplaceAllStringFunc(s, func(ref string) string {
		name := strings.Trim(ref, "${}")
		v, ok := env[name]
		if !ok {
			t.Errorf("%s: %s is not defined in hosts.env.example", where, ref)
		}
		return v
	})
}

// deployFlagPending: --data-path on a node is added by the node-local data
// change (dataset local: each node's own file), under way beside these
// files. Until it lands it is the one flag allowed to be missing, and only
// when the real command lacks it.
func deployFlagPending(cmd *cobra.Command, role, flag string) bool {
	return role == "node" && flag == "data-path" && cmd.Flags().Lookup(flag) == nil
}

// parseDeployCommand parses args, expanded with env, with the real command
// of role (flags the command lacks fail the test, except a pending one,
// which is dropped) and returns it.
func parseDeployCommand(t *testing.T, dc deployCommand, env map[string]string) *cobra.Command {
	t.Helper()
	var cmd *cobra.Command
	var rest []string
	switch dc.role {
	case "replica":
		sub, r, err := NewCoordinatorCmd().Find(dc.args)
		if err != nil || sub.Name() != "serve" {
			t.Fatalf("%s: coordinator %s: %v", dc.file, strings.Join(dc.args, " "), err)
		}
		cmd, rest = sub, r
	case "node":
		cmd, rest = NewNodeCmd(), dc.args
	}
	var parse []string
	for _, a := range rest {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || name == "" {
			t.Errorf("%s: argument %q is not --flag or --flag=value", dc.file, a)
			continue
		}
		if deployFlagPending(cmd, dc.role, name) {
			t.Logf("%s: --%s is not a flag of %s yet (pending: the node-local data change)", dc.file, name, cmd.Name())
			continue
		}
		if cmd.Flags().Lookup(name) == nil {
			t.Errorf("%s: --%s is not a flag of %s", dc.file, name, cmd.CommandPath())
			continue
		}
		parse = append(parse, expandDeploy(t, dc.file, a, env))
	}
	if err := cmd.ParseFlags(parse); err != nil {
		t.Errorf("%s: %v", dc.file, err)
	}
	return cmd
}

// TestDeployFilesFlags: every flag of the deploy files' commands is a flag
// of the command they run, with a value it parses; the compose file and
// the systemd unit of a role run the same command; the transport is mutual
// TLS across the network (the secure-by-default check passes, no
// --insecure); Raft advertises the address --peers gives this replica.
func TestDeployFilesFlags(t *testing.T) {
	env := deployEnv(t)
	byRole := map[string][]deployCommand{}
	for _, dc := range deployCommands(t) {
		byRole[dc.role] = append(byRole[dc.role], dc)
		cmd := parseDeployCommand(t, dc, env)
		flag := func(name string) string { return cmd.Flags().Lookup(name).Value.String() }
		var eps []endpoint
		switch dc.role {
		case "replica":
			peers, err := parsePeers(flag("peers"))
			if err != nil {
				t.Fatalf("%s: %v", dc.file, err)
			}
			f := serveFlags{raftAddr: flag("raft-addr"), natsListen: flag("nats-listen"),
				natsCluster: flag("nats-cluster"), natsRoutes: flag("nats-routes")}
			eps = f.endpoints(peers)
			if i := slices.IndexFunc(peers, func(p raft.Server) bool { return string(p.ID) == flag("id") }); i < 0 ||
				string(peers[i].Address) != f.raftAddr {
				t.Errorf("%s: --id %s --raft-addr %s, but --peers %s", dc.file, flag("id"), f.raftAddr, flag("peers"))
			}
			if !cmd.Flags().Changed("bootstrap") {
				t.Errorf("%s: without --bootstrap the three replicas never form the cluster", dc.file)
			}
		case "node":
			eps = endpoints("--nats", strings.Split(flag("nats"), ",")...)
		}
		insecure, _ := cmd.Flags().GetBool("insecure")
		if err := checkTransportSecurity(eps, tlsFlagsGiven(cmd.Flags()), insecure); err != nil || insecure {
			t.Errorf("%s: transport check %v, --insecure %v; want mutual TLS", dc.file, err, insecure)
		}
		if cmd.Flags().Lookup("config").Value.String() != env["RUN_FILE"] {
			t.Errorf("%s does not read the run file $RUN_FILE", dc.file)
		}
	}
	for role, dcs := range byRole {
		if len(dcs) != 2 || !slices.Equal(dcs[0].args, dcs[1].args) {
			var lines []string
			for _, dc := range dcs {
				lines = append(lines, dc.file+": "+strings.Join(dc.args, " "))
			}
			t.Errorf("%s: the compose file and the unit run different commands:\n%s", role, strings.Join(lines, "\n"))
		}
	}
	if len(byRole) != 2 {
		t.Errorf("roles %v, want replica and node", slices.Collect(maps.Keys(byRole)))
	}
}

// TestDeployFilesEnv: hosts.env.example defines every variable the deploy
// files use and nothing they do not; the units read it, are restarted on
// failure only and are hardened; the compose services run on the host's
// network as the host's user and mount every host path their command names.
func TestDeployFilesEnv(t *testing.T) {
	env := deployEnv(t)
	used := map[string]bool{}
	for _, f := range []string{"compose/replica.yml", "compose/node.yml", "systemd/dpcluster-replica.service", "systemd/dpcluster-node.service"} {
		data, err := os.ReadFile(filepath.Join(deployDir, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			for _, m := range deployVarRE.FindAllStringSubmatch(line, -1) {
				name, braced := strings.CutPrefix(m[1], "{")
				name = strings.TrimSuffix(name, "}")
				if !braced {
					t.Errorf("%s: $%s: write ${%s} (systemd splits $NAME at spaces)", f, name, name)
				}
				if _, ok := env[name]; !ok {
					t.Errorf("%s uses ${%s}, which hosts.env.example does not define", f, name)
				}
				used[name] = true
			}
		}
	}
	for name := range env {
		if !used[name] {
			t.Errorf("hosts.env.example defines %s, which no compose file or unit uses", name)
		}
	}
	for _, dc := range deployCommands(t) {
		s := dc.settings
		one := func(k string) string {
			if len(s[k]) != 1 {
				return ""
			}
			return s[k][0]
		}
		if strings.HasPrefix(dc.file, "systemd") {
			for k, want := range map[string]string{"EnvironmentFile": "/etc/dpcluster/hosts.env", "Restart": "on-failure",
				"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes", "CapabilityBoundingSet": "",
				"User": "dpcluster"} {
				if got := s[k]; !slices.Equal(got, []string{want}) {
					t.Errorf("%s: %s=%q, want %q", dc.file, k, got, want)
				}
			}
			if dc.role == "replica" && one("StateDirectory") != "dpcluster" {
				t.Errorf("%s: StateDirectory=%q, want dpcluster (/var/lib/dpcluster, the data dir's parent)", dc.file, s["StateDirectory"])
			}
			continue
		}
		for k, want := range map[string]string{"image": "${DPCLUSTER_IMAGE}", "user": "${DPCLUSTER_USER}", "network_mode": "host", "restart": "on-failure"} {
			if got := one(k); got != want {
				t.Errorf("%s: %s %q, want %q", dc.file, k, got, want)
			}
		}
		// Every absolute path the command names is the host's, mounted at
		// the same path: read-only but for the replica's state.
		mounts := map[string]string{}
		for _, v := range dc.volumes {
			parts := strings.Split(expandDeploy(t, dc.file, v, env), ":")
			if len(parts) < 2 || parts[0] != parts[1] {
				t.Errorf("%s: volume %q is not a host path at the same path", dc.file, v)
				continue
			}
			mounts[parts[0]] = strings.Join(parts[2:], ":")
		}
		for _, a := range dc.args {
			_, v, _ := strings.Cut(expandDeploy(t, dc.file, a, env), "=")
			if !strings.HasPrefix(v, "/") {
				continue
			}
			want := "ro"
			if strings.HasPrefix(a, "--data-dir=") {
				want = ""
			}
			found := false
			for m, opts := range mounts {
				if v == m || strings.HasPrefix(v, m+"/") {
					found = true
					if opts != want {
						t.Errorf("%s: %s is mounted with %q, want %q", dc.file, m, opts, want)
					}
				}
			}
			if !found {
				t.Errorf("%s: %s names %s, which no volume mounts", dc.file, a, v)
			}
		}
	}
}

// TestDeployFilesCerts runs deploy/README.md's certs init command and puts
// each machine's bundle where its env file says (CERT_DIR): every replica's
// and node's command then names the three files of its own bundle, which
// hold a certificate of the run's CA for its role and --id, valid for
// every host it is dialed at.
func TestDeployFilesCerts(t *testing.T) {
	env := deployEnv(t)
	readme, err := os.ReadFile(filepath.Join(deployDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var initLine string
	lines := strings.Split(string(readme), "\n")
	for i := 0; i < len(lines) && initLine == ""; i++ {
		if !strings.HasPrefix(lines[i], "$ ") || !strings.Contains(lines[i], "coordinator certs init") {
			continue
		}
		for l := lines[i]; ; l = lines[i] {
			cont, more := strings.CutSuffix(l, `\`)
			initLine += cont + " "
			if !more {
				break
			}
			i++
		}
	}
	_, initLine, ok := strings.Cut(initLine, "coordinator certs init")
	if !ok {
		t.Fatal("deploy/README.md shows no `$ ... coordinator certs init` command")
	}
	args := strings.Fields(expandDeploy(t, "README.md", initLine, env))
	initCmd := parseCoordinatorCmd(t, append([]string{"certs", "init"}, args...))
	list := func(name string) []string { v, _ := initCmd.Flags().GetStringSlice(name); return v }
	if b, _ := initCmd.Flags().GetBool("bundles"); !b {
		t.Error("the README's certs init has no --bundles")
	}
	// The same command, writing to a temporary --dir.
	dir := filepath.Join(t.TempDir(), "certs")
	run := []string{"certs", "init", "--dir", dir}
	for i := 0; i < len(args); i++ {
		switch {
		case args[i] == "--dir":
			i++
		case !strings.HasPrefix(args[i], "--dir="):
			run = append(run, args[i])
		}
	}
	if out, _, err := runCmd(t, run...); err != nil {
		t.Fatalf("certs init %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	ca, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)

	ids := map[string][]string{"replica": list("replicas"), "node": list("nodes")}
	for _, id := range []string{env["REPLICA_ID"], "r1", "r2", "r3"} {
		if !slices.Contains(ids["replica"], id) {
			t.Errorf("certs init issues replicas %v, not %s (hosts.env.example, --peers)", ids["replica"], id)
		}
	}
	if !slices.Contains(ids["node"], env["NODE_ID"]) {
		t.Errorf("certs init issues nodes %v, not NODE_ID %s", ids["node"], env["NODE_ID"])
	}
	// The replicas' addresses (--peers) and where they are dialed: by the
	// nodes (--nats) and by the other members' routes (--nats-routes).
	var peers []raft.Server
	var dialed []string
	for _, dc := range deployCommands(t) {
		fl := parseDeployCommand(t, dc, env).Flags()
		if dc.role == "replica" {
			if peers, err = parsePeers(fl.Lookup("peers").Value.String()); err != nil {
				t.Fatal(err)
			}
			dialed = append(dialed, strings.Split(fl.Lookup("nats-routes").Value.String(), ",")...)
		} else {
			dialed = append(dialed, strings.Split(fl.Lookup("nats").Value.String(), ",")...)
		}
	}
	for _, dc := range deployCommands(t) {
		for _, id := range ids[dc.role] {
			// This machine's env file: its ID, its address (a replica's,
			// from --peers; r1..r3 only) and its bundle as CERT_DIR.
			menv := maps.Clone(env)
			menv["CERT_DIR"] = pki.BundlePath(dir, id)
			if dc.role == "replica" {
				i := slices.IndexFunc(peers, func(p raft.Server) bool { return string(p.ID) == id })
				if i < 0 {
					continue // a fourth replica would --join: not these files
				}
				menv["REPLICA_ID"] = id
				menv["HOST_ADDR"], _, _ = net.SplitHostPort(string(peers[i].Address))
			} else {
				menv["NODE_ID"] = id
			}
			cmd := parseDeployCommand(t, dc, menv)
			flag := func(name string) string { return cmd.Flags().Lookup(name).Value.String() }
			if flag("id") != id {
				t.Errorf("%s as %s: --id %s", dc.file, id, flag("id"))
			}
			var files []string
			for _, f := range []string{"tls-ca", "tls-cert", "tls-key"} {
				p := flag(f)
				if filepath.Dir(p) != menv["CERT_DIR"] {
					t.Errorf("%s as %s: --%s %s is not in CERT_DIR", dc.file, id, f, p)
				}
				files = append(files, filepath.Base(p))
			}
			slices.Sort(files)
			bundle := pki.BundleFiles(id)
			slices.Sort(bundle)
			if !slices.Equal(files, bundle) {
				t.Errorf("%s as %s: names %v, the bundle holds %v", dc.file, id, files, bundle)
			}
			pair, err := tls.LoadX509KeyPair(flag("tls-cert"), flag("tls-key"))
			if err != nil {
				t.Errorf("%s as %s: %v", dc.file, id, err)
				continue
			}
			if role, gotID, err := pki.Identity(pair.Leaf); err != nil || string(role) != dc.role || gotID != id {
				t.Errorf("%s as %s: certificate of %s %q, %v", dc.file, id, role, gotID, err)
			}
			caPEM, _ := os.ReadFile(flag("tls-ca"))
			bundleRoots := x509.NewCertPool()
			if !bundleRoots.AppendCertsFromPEM(caPEM) {
				t.Errorf("%s as %s: --tls-ca holds no certificate", dc.file, id)
			}
			if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: bundleRoots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Errorf("%s as %s: %v", dc.file, id, err)
			}
			// A replica's certificate must be valid for every address a
			// replica is dialed at.
			if dc.role == "replica" {
				for _, a := range dialed {
					h, err := addrHost(a)
					if err == nil {
						err = pair.Leaf.VerifyHostname(h)
					}
					if err != nil {
						t.Errorf("%s as %s: dialed at %s: %v", dc.file, id, a, err)
					}
				}
			}
		}
	}
}
