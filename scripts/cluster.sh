#!/usr/bin/env bash
# A cluster of hosts on this machine: network namespaces joined by veth
# pairs to a bridge, each running its own sshd, for testing cclrun across
# hosts. Needs root, iproute2 and openssh-server.
#
#   scripts/cluster.sh up DIR [HOSTS] [SLOTS] [NICS]
#                                               create; writes DIR/hostfile, DIR/id (client key),
#                                               DIR/known_hosts, DIR/env (CCLRUN_SSH_ARGS=...);
#                                               each host has NICS interfaces (eth0, eth1, ...,
#                                               default 1), interface k of every host on a
#                                               bridge and subnet of its own (sshd on eth0's)
#   scripts/cluster.sh shape DIR RATE|off       limit every link to RATE (tc tbf, e.g. 1gbit) or lift it
#   scripts/cluster.sh down DIR                 end every process in the namespaces (by PID), delete them
#
# Namespaces share one kernel, hostname and boot id, so each sshd sets
# CCL_HOSTID=<name> for its sessions (SetEnv): ccl then sees separate hosts.
# Then, for example:
#   cclrun -np 8 --hostfile DIR/hostfile --ssh-key DIR/id --known-hosts DIR/known_hosts ./app
set -euo pipefail

cmd=${1:?usage: cluster.sh up|shape|down DIR ...}
dir=${2:?usage: cluster.sh up|shape|down DIR ...}

# names from a tag kept in DIR, so several clusters can coexist
names() {
    tag=$(cat "$dir/tag")
    net=$(cat "$dir/net")
    br="cb$tag"
    nics=$(cat "$dir/nics" 2>/dev/null || echo 1)
}

# the subnet of interface k (1 and up) besides eth0
net_of() {
    echo "172.$(( 16 + tag % 16 )).$(( (tag / 16 + $1) % 250 ))"
}

up() {
    local hosts=${3:-4} slots=${4:-2} nics=${5:-1}
    [ "$(id -u)" = 0 ] || { echo "cluster.sh: needs root" >&2; exit 1; }
    for t in ip ssh-keygen /usr/sbin/sshd; do
        command -v "$t" >/dev/null || { echo "cluster.sh: $t not found (apt install iproute2 openssh-server)" >&2; exit 1; }
    done
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    echo $(( $$ % 100000 )) >"$dir/tag"
    echo "10.$(( 100 + $$ % 100 )).$(( ($$ / 100) % 250 ))" >"$dir/net"
    echo "$nics" >"$dir/nics"
    names
    mkdir -p /run/sshd
    ssh-keygen -q -t ed25519 -N '' -C cclrun-test -f "$dir/id"
    cp "$dir/id.pub" "$dir/authorized_keys"
    : >"$dir/known_hosts"
    : >"$dir/hostfile"
    ip link add "$br" type bridge
    ip addr add "$net.1/24" dev "$br"
    ip link set "$br" up
    for k in $(seq 1 $(( nics - 1 ))); do
        ip link add "$br-$k" type bridge
        ip link set "$br-$k" up
    done
    for i in $(seq 1 "$hosts"); do
        local ns="ccl$tag-h$i" veth="cv${tag}h$i" addr="$net.$(( 10 + i ))" h="$dir/h$i"
        mkdir -p "$h"
        echo "$ns" >>"$dir/namespaces"
        ip netns add "$ns"
        ip link add "$veth" type veth peer name eth0 netns "$ns"
        ip link set "$veth" master "$br" up
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "$addr/24" dev eth0
        ip -n "$ns" link set eth0 up
        for k in $(seq 1 $(( nics - 1 ))); do
            ip link add "$veth-$k" type veth peer name "eth$k" netns "$ns"
            ip link set "$veth-$k" master "$br-$k" up
            ip -n "$ns" addr add "$(net_of "$k").$(( 10 + i ))/24" dev "eth$k"
            ip -n "$ns" link set "eth$k" up
        done
        ssh-keygen -q -t ed25519 -N '' -C "host$i" -f "$h/hostkey"
        cat >"$h/sshd_config" <<EOF
ListenAddress $addr
HostKey $h/hostkey
PidFile none
AuthorizedKeysFile $dir/authorized_keys
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
SetEnv CCL_HOSTID=host$i
LogLevel ERROR
EOF
        ip netns exec "$ns" /usr/sbin/sshd -D -e -f "$h/sshd_config" >>"$h/sshd.log" 2>&1 &
        echo $! >"$h/sshd.pid"
        echo "$addr $(cut -d' ' -f1,2 "$h/hostkey.pub")" >>"$dir/known_hosts"
        echo "$addr slots=$slots" >>"$dir/hostfile"
    done
    for i in $(seq 1 "$hosts"); do
        local addr="$net.$(( 10 + i ))" ok=
        for _ in $(seq 1 100); do
            if timeout 1 bash -c "exec 3<>/dev/tcp/$addr/22" 2>/dev/null; then ok=1; break; fi
            sleep 0.1
        done
        [ -n "$ok" ] || { echo "cluster.sh: sshd on $addr did not start: $(cat "$dir/h$i/sshd.log")" >&2; exit 1; }
    done
    echo "CCLRUN_SSH_ARGS=--ssh-key $dir/id --known-hosts $dir/known_hosts" >"$dir/env"
}

shape() {
    local rate=${3:?usage: cluster.sh shape DIR RATE|off}
    names
    for ns in $(cat "$dir/namespaces"); do
        local i=${ns##*-h} veth
        veth="cv${tag}h$i"
        tc qdisc del dev "$veth" root 2>/dev/null || true
        ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
        if [ "$rate" != off ]; then
            tc qdisc add dev "$veth" root tbf rate "$rate" burst 512kb latency 100ms
            ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 512kb latency 100ms
        fi
    done
}

down() {
    [ -f "$dir/tag" ] || return 0
    names
    local ns pids
    for ns in $(cat "$dir/namespaces" 2>/dev/null); do
        # sshd, and any session or rank still running in the namespace
        pids="$(cat "$dir/h${ns##*-h}/sshd.pid" 2>/dev/null || true) $(ip netns pids "$ns" 2>/dev/null || true)"
        for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
        sleep 0.2
        for p in $(ip netns pids "$ns" 2>/dev/null || true) $pids; do kill -KILL "$p" 2>/dev/null || true; done
        ip link del "cv${tag}h${ns##*-h}" 2>/dev/null || true
        for k in $(seq 1 $(( nics - 1 ))); do ip link del "cv${tag}h${ns##*-h}-$k" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
    done
    ip link del "$br" 2>/dev/null || true
    for k in $(seq 1 $(( nics - 1 ))); do ip link del "$br-$k" 2>/dev/null || true; done
    rm -f "$dir/tag" "$dir/namespaces" "$dir/nics"
}

case "$cmd" in
    up) up "$@" ;;
    shape) shape "$@" ;;
    down) down "$@" ;;
    *) echo "cluster.sh: unknown command $cmd (up, shape, down)" >&2; exit 2 ;;
esac
