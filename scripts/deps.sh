#!/usr/bin/env bash
# Installs the Debian packages ccl needs, if missing.
#   scripts/deps.sh build   compiler, pkg-config, OpenSSL headers (libssh2 for cclrun's SSH)
#   scripts/deps.sh test    + sshd and iproute2 (namespace cluster tests), Open MPI and
#                           libclang (mpirun tests, the `mpi` feature)
set -euo pipefail
want=(build-essential pkg-config libssl-dev)
if [ "${1:-build}" = test ]; then
    want+=(openssh-server openssh-client iproute2 openmpi-bin libopenmpi-dev libclang-dev)
fi
missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "deps: installing ${missing[*]}" >&2
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
