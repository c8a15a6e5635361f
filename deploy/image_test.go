package deploy

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/elf"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/coretest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// imageConfig is what podman image inspect says of the image.
type imageConfig struct {
	Size   int64
	Config struct {
		User       string
		Entrypoint []string
		Cmd        []string
		WorkingDir string
	}
}

// TestImage builds the image with make image, exports its root file system
// and runs the binary from it, chrooted, as the image's user and with the
// image's entrypoint and command, against a real registry reached with
// sslmode=verify-full: first with the image's own Corefile (which must fail
// on the registry's certificate until its CA is in the image's bundle, then
// answer), then with the Kubernetes ConfigMap's Corefile and a real Redis.
// Only the listeners of each Corefile are moved to free loopback ports.
func TestImage(t *testing.T) {
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatal("podman not found: this test builds the image with it; run scripts/setup.sh (make test does)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("this test runs the image's binary chrooted in the image's file system as the image's user, which needs root")
	}
	root := repoRoot(t)
	tag := fmt.Sprintf("localhost/pgcluster-coredns-test:%d", os.Getpid())
	start := time.Now()
	run(t, root, nil, "make", "--no-print-directory", "image", "IMAGE="+tag, "IMAGE_DIR="+t.TempDir())
	t.Cleanup(func() {
		if out, err := exec.Command("podman", "rmi", "-f", tag).CombinedOutput(); err != nil {
			t.Errorf("podman rmi %s: %v\n%s", tag, err, out)
		}
	})
	cfg := inspectImage(t, tag)
	t.Logf("make image: %.1fs; image size %d bytes (%.1f MB)", time.Since(start).Seconds(), cfg.Size, float64(cfg.Size)/1e6)

	uid, gid := imageUser(t, cfg)
	if !slices.Equal(cfg.Config.Cmd, []string{"-conf", corefilePath}) || !slices.Equal(cfg.Config.Entrypoint, []string{"/coredns"}) {
		t.Errorf("image entrypoint %v, command %v: want [/coredns] and [-conf %s]", cfg.Config.Entrypoint, cfg.Config.Cmd, corefilePath)
	}
	rootfs := exportImage(t, tag)
	checkRootfs(t, rootfs, uid)

	pg, ca := tlsRegistry(t)
	dsn := fmt.Sprintf("postgres://postgres@%s:%d/postgres?sslmode=verify-full&connect_timeout=5", pg.Host, pg.Port)

	t.Run("image Corefile", func(t *testing.T) {
		image, err := os.ReadFile("image/Corefile")
		if err != nil {
			t.Fatal(err)
		}
		env := map[string]string{"PGCLUSTER_POSTGRES": dsn}
		argv := append(slices.Clone(cfg.Config.Entrypoint), cfg.Config.Cmd...)
		mk := chrootCoreDNS(t, rootfs, string(image), cfg.Config.WorkingDir, argv, uid, gid, env)

		// The registry's CA is not in the image's bundle yet: verify-full
		// must refuse its certificate, and the instance must not be ready.
		in := startCoreDNS(t, mk)
		err = in.Wait(readyTimeout, func() error {
			if !strings.Contains(in.Log(), "certificate signed by unknown authority") {
				return fmt.Errorf("no certificate error logged")
			}
			code, _, err := in.get(in.Ready, "/ready")
			if err != nil {
				return err
			}
			if code == http.StatusOK {
				t.Fatalf("/ready is 200 while the registry's certificate is refused; log:\n%s", in.Log())
			}
			return nil
		})
		if err != nil {
			t.Fatalf("with the registry's CA not in the image: %v\nlog:\n%s", err, in.Log())
		}
		if err := in.Stop(); err != nil {
			t.Fatal(err)
		}

		bundle := filepath.Join(rootfs, "etc/ssl/certs/ca-certificates.crt")
		f, err := os.OpenFile(bundle, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.Write(ca)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		in = runCoreDNS(t, mk)
		in.waitAddrs(t, "local."+Zone, testNodeAddr)
		in.waitHTTP(t, in.Ready, "/ready", "OK")
		in.waitHTTP(t, in.Health, "/health", "OK")
		in.waitHTTP(t, in.Metrics, "/metrics", `coredns_pgcluster_registry_up{zone="pgcluster.lan."} 1`)
		checkUID(t, in, uid)
	})

	t.Run("kubernetes Corefile", func(t *testing.T) {
		ms := loadManifests(t)
		corefile := one(t, ms, "ConfigMap").Data["Corefile"]
		c := one(t, ms, "Deployment").Spec.Template.Spec.Containers[0]
		rdb := redistest.Start(t)
		values := map[string]string{
			"PGCLUSTER_POSTGRES":     dsn,
			"PGCLUSTER_CHECK":        "user=postgres dbname=postgres sslmode=disable",
			"PGCLUSTER_REDIS_URL":    rdb.URL(),
			"PGCLUSTER_REDIS_SECRET": coretest.RandomHex(32),
		}
		env := map[string]string{}
		for name := range k8sEnv(t, ms) {
			v, ok := values[name]
			if !ok {
				t.Fatalf("deployment.yaml sets %s, which this test has no value for", name)
			}
			env[name] = v
		}
		argv := append(slices.Clone(cfg.Config.Entrypoint), c.Args...)
		in := runCoreDNS(t, chrootCoreDNS(t, rootfs, corefile, cfg.Config.WorkingDir, argv, uid, gid, env))
		// The node is unreachable (a documentation address): its check
		// fails, and all_down open still answers it.
		in.waitAddrs(t, "local."+Zone, testNodeAddr)
		in.waitHTTP(t, in.Ready, "/ready", "OK")
		in.waitHTTP(t, in.Health, "/health", "OK")
		in.waitHTTP(t, in.Metrics, "/metrics", `coredns_pgcluster_redis_mode{mode="coordinated",zone="pgcluster.lan."} 1`)
		checkUID(t, in, uid)
	})
}

// inspectImage returns the image's configuration and size.
func inspectImage(t testing.TB, tag string) imageConfig {
	t.Helper()
	out, err := exec.Command("podman", "image", "inspect", tag).Output()
	if err != nil {
		t.Fatalf("podman image inspect %s: %v", tag, err)
	}
	var cfgs []imageConfig
	if err := json.Unmarshal(out, &cfgs); err != nil || len(cfgs) != 1 {
		t.Fatalf("podman image inspect %s: %v\n%s", tag, err, out)
	}
	return cfgs[0]
}

// imageUser returns the numeric user and group the image runs as, failing
// the test unless both are numeric and not root.
func imageUser(t testing.TB, cfg imageConfig) (uid, gid uint32) {
	t.Helper()
	u, g, _ := strings.Cut(cfg.Config.User, ":")
	un, uerr := strconv.ParseUint(u, 10, 32)
	gn, gerr := strconv.ParseUint(g, 10, 32)
	if uerr != nil || gerr != nil || un == 0 || gn == 0 {
		t.Fatalf("image user %q: want numeric, non-root USER uid:gid (Kubernetes' runAsNonRoot checks it)", cfg.Config.User)
	}
	if un != imageUID {
		t.Errorf("image user %d, deploy/kubernetes expects %d", un, imageUID)
	}
	return uint32(un), uint32(gn)
}

// exportImage writes the image's root file system to a directory, through a
// container that is created, exported and removed, never run.
func exportImage(t testing.TB, tag string) string {
	t.Helper()
	out, err := exec.Command("podman", "create", tag).Output()
	if err != nil {
		t.Fatalf("podman create %s: %v", tag, err)
	}
	id := strings.TrimSpace(string(out))
	defer func() {
		if out, err := exec.Command("podman", "rm", "-f", id).CombinedOutput(); err != nil {
			t.Errorf("podman rm %s: %v\n%s", id, err, out)
		}
	}()
	dir := t.TempDir()
	tarball := filepath.Join(dir, "rootfs.tar")
	run(t, dir, nil, "podman", "export", "-o", tarball, id)
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, dir, nil, "tar", "-x", "-p", "-f", tarball, "-C", rootfs)
	return rootfs
}

// checkRootfs checks the image's files: a static binary, the build host's
// CA bundle, the user in /etc/passwd, and deploy/image/Corefile at the
// documented path.
func checkRootfs(t testing.TB, rootfs string, uid uint32) {
	t.Helper()
	bin, err := elf.Open(filepath.Join(rootfs, "coredns"))
	if err != nil {
		t.Fatalf("the image's /coredns: %v", err)
	}
	defer bin.Close()
	for _, p := range bin.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the image's /coredns is dynamically linked (it has an interpreter): build it with CGO_ENABLED=0")
		}
	}
	want, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(rootfs, "etc/ssl/certs/ca-certificates.crt"))
	if err != nil || !bytes.Equal(got, want) || !x509.NewCertPool().AppendCertsFromPEM(got) {
		t.Errorf("the image's CA bundle is not the build host's /etc/ssl/certs/ca-certificates.crt (%v)", err)
	}
	passwd, err := os.ReadFile(filepath.Join(rootfs, "etc/passwd"))
	if err != nil || !regexp.MustCompile(fmt.Sprintf(`(?m)^[a-z]+:x:%d:%d:`, uid, uid)).Match(passwd) {
		t.Errorf("the image's /etc/passwd has no user %d (%v):\n%s", uid, err, passwd)
	}
	shipped, err := os.ReadFile(filepath.Join(rootfs, strings.TrimPrefix(corefilePath, "/")))
	if src, _ := os.ReadFile("image/Corefile"); err != nil || !bytes.Equal(shipped, src) {
		t.Errorf("the image's %s is not deploy/image/Corefile (%v)", corefilePath, err)
	}
}

// chrootCoreDNS returns a command maker for runCoreDNS: argv run chrooted
// in rootfs, in dir, as uid:gid, with env alone, after writing corefile
// (its listeners on loopback) where the image reads its Corefile.
func chrootCoreDNS(t testing.TB, rootfs, corefile, dir string, argv []string, uid, gid uint32, env map[string]string) func(ports) (*exec.Cmd, error) {
	return func(p ports) (*exec.Cmd, error) {
		local, err := localize(corefile, p)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(rootfs, strings.TrimPrefix(corefilePath, "/")), []byte(local), 0o644); err != nil {
			return nil, err
		}
		if dir == "" {
			dir = "/"
		}
		cmd := &exec.Cmd{Path: argv[0], Args: argv, Dir: dir, Env: []string{}}
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs, Credential: &syscall.Credential{Uid: uid, Gid: gid}}
		return cmd, nil
	}
}

// checkUID checks that the instance runs as uid.
func checkUID(t testing.TB, in *instance, uid uint32) {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", in.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("\nUid:\t%d\t%d\t%d\t%d\n", uid, uid, uid, uid)
	if !strings.Contains(string(status), want) {
		t.Errorf("the instance does not run as uid %d:\n%s", uid, status)
	}
}

// tlsRegistry starts a registry (registry's rows) serving TLS with a
// certificate for its loopback address, signed by a CA made here, and
// returns the server and that CA's certificate in PEM.
func tlsRegistry(t testing.TB) (*pgtest.Postgres, []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pgcluster test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: pgtest.DefaultHost},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP(pgtest.DefaultHost)},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}

	// PostgreSQL reads them as its own user, and wants the key private.
	dir, err := os.MkdirTemp("", "pgcluster-deploy-tls-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	certFile, keyFile := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		pgUser, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, PostgreSQL runs as the postgres user, which does not exist: %v", err)
		}
		u, _ := strconv.Atoi(pgUser.Uid)
		g, _ := strconv.Atoi(pgUser.Gid)
		for _, f := range []string{dir, certFile, keyFile} {
			if err := os.Chown(f, u, g); err != nil {
				t.Fatal(err)
			}
		}
	}
	pg := registry(t, pgtest.Options{Settings: map[string]string{"ssl": "on", "ssl_cert_file": certFile, "ssl_key_file": keyFile}})
	return pg, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}
