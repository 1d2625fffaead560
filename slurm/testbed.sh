#!/usr/bin/env bash
# A real multi-node Slurm cluster on one Debian 12 machine, for trying hpc_train and for its integration tests.
#
#   slurm/testbed.sh install   # apt-get install slurm-wlm munge slurmdbd mariadb-server iproute2 (once)
#   slurm/testbed.sh start     # munge, MariaDB, slurmdbd, slurmctld and N slurmd "nodes" (idempotent)
#   slurm/testbed.sh status    # what runs, and sinfo
#   slurm/testbed.sh stop      # cancel jobs, stop daemons, remove namespaces and the /etc/hosts lines it added
#   slurm/testbed.sh stop-dbd  # stop slurmdbd only (to see hpc_train work where sacct does not)
#   eval "$(slurm/testbed.sh env)"  # this generation's client commands first on PATH, with their config
#
# Two Slurm generations, one at a time: HPC_TESTBED_SLURM=22.05 (the default: Debian 12's packages) or 24.11
# (Debian 13's slurm-wlm 24.11.5, which cannot be installed over Debian 12's libraries). For 24.11, `install`
# downloads Debian 13's Slurm packages and their libraries with an apt configuration of its own (this machine's
# packages and sources stay as they are), unpacks them under $HPC_TESTBED_CACHE/slurm-24.11/root, and points
# each binary at that tree's loader and libraries (patchelf), so that they run beside Debian 12's without
# touching them. Why not a Debian 13 root file system (debootstrap): the jobs' steps must run this machine's
# Python and virtual environments, which would then have to be bind-mounted into it with every library they
# load; here only Slurm's own processes are 24.11, and everything a job runs is the machine's own. slurmd finds
# slurmstepd at the path it was built with (/usr/sbin/slurmstepd, Debian 12's here): each 24.11 node runs in a
# mount namespace of its own where that path is the 24.11 one. The 24.11 testbed keeps its state (configs,
# MariaDB's data, logs) in $HPC_TESTBED_DIR, /var/lib/hpc-train-testbed-24.11 by default, and writes nothing
# in /etc/slurm; it uses the same nodes, partitions, fake GPUs, ports and munge as the 22.05 one, so `start`
# refuses while the other generation runs.
#
# Each node is a network namespace with its own hostname (node1, node2, ...) and address (10.77.0.11, ...) on a
# bridge; the controller and slurmdbd run in the root namespace at 10.77.0.1. Two partitions of different node
# sizes: debug (the default: node1..nodeN, CPU only) and gpu (the next GPU_NODES nodes, each with more CPUs and
# memory and 2 fake GPUs declared as GRES, gpu:tesla:2, so --gpus-per-node sets CUDA_VISIBLE_DEVICES), and a
# third, all, of every node (3 by default: room for 2 training nodes and a spare). Everything the testbed writes
# lives under $HPC_TESTBED_DIR (default /var/lib/hpc-train-testbed), plus /etc/slurm/slurm.conf (which it only
# writes when absent or its own) and tagged lines in /etc/hosts. Needs root. See slurm/README.md.
set -euo pipefail

NODES=${HPC_TESTBED_NODES:-2}
CPUS=${HPC_TESTBED_CPUS:-4}            # CPUs each node declares; SlurmdParameters=config_overrides allows more than real
MEM_MB=${HPC_TESTBED_MEM_MB:-4096}     # memory each node declares
GPU_NODES=${HPC_TESTBED_GPU_NODES:-1}  # nodes of the gpu partition, after the CPU ones
GPU_CPUS=8
GPU_MEM_MB=8192
GPUS=2                                 # fake GPUs per GPU node: character devices listed in gres.conf
GPU_MAX_TIME=02:00:00
TOTAL=$((NODES + GPU_NODES))
SLURM_GENERATION=${HPC_TESTBED_SLURM:-22.05}
CACHE=${HPC_TESTBED_CACHE:-/var/cache/hpc-train-testbed}
case $SLURM_GENERATION in
22.05)
    STATE=${HPC_TESTBED_DIR:-/var/lib/hpc-train-testbed}
    OTHER_STATE=/var/lib/hpc-train-testbed-24.11
    CONF_DIR=/etc/slurm
    PLUGIN_DIR=
    ;;
24.11)
    STATE=${HPC_TESTBED_DIR:-/var/lib/hpc-train-testbed-24.11}
    OTHER_STATE=/var/lib/hpc-train-testbed
    CONF_DIR=$STATE/etc
    ROOT=$CACHE/slurm-24.11/root  # Debian 13's packages, unpacked and patched by `install`
    LIBS=$ROOT/usr/lib/x86_64-linux-gnu
    PLUGIN_DIR=$LIBS/slurm-wlm
    # The clients and daemons by their usual names (the daemons' names are what `alive` checks).
    export PATH=$CACHE/slurm-24.11/bin:$CACHE/slurm-24.11/sbin:$PATH
    export SLURM_CONF=$CONF_DIR/slurm.conf
    ;;
*)
    echo "testbed: error: HPC_TESTBED_SLURM=$SLURM_GENERATION is not a generation this testbed runs: 22.05 or 24.11" >&2
    exit 2
    ;;
esac
SUBNET=10.77.0
BRIDGE=hpctb0
TAG="# hpc-train-testbed"
CLUSTER=testbed
CONF=$CONF_DIR/slurm.conf
DBD_CONF=$CONF_DIR/slurmdbd.conf
GRES_CONF=$CONF_DIR/gres.conf
CLIENTS=(sacct sacctmgr salloc sattach sbatch sbcast scancel scontrol sdiag sinfo sprio squeue sreport srun sshare sstat strigger)
SOCKET=$STATE/run/mysqld.sock
CTL_HOST=$(hostname -s)

log() { echo "testbed: $*" >&2; }
die() { log "error: $*"; exit 1; }

# A pid that runs (a zombie, left when a daemon's parent does not reap it, counts as stopped) and, when a name
# is given, is that program: a pid file left from an earlier boot or session may name a reused pid.
alive() {
    local pid=$1 name=${2:-}
    [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
    local state
    state=$(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
    [ "$state" != Z ] || return 1
    [ -z "$name" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]
}
pid_of() { [ -r "$1" ] && cat "$1" 2>/dev/null || true; }

# Poll a command until it succeeds; every wait here has a limit.
wait_for() {
    local what=$1 limit=$2; shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || die "timed out after ${limit}s waiting for $what"
        sleep 0.2
    done
}

need_root() { [ "$(id -u)" = 0 ] || die "needs root (it starts daemons and creates network namespaces)"; }

cmd_install() {
    need_root
    local missing=()
    local needed=(slurm-wlm munge slurmdbd mariadb-server iproute2)
    [ "$SLURM_GENERATION" = 22.05 ] || needed+=(patchelf)
    for pkg in "${needed[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        log "packages already installed"
    else
        log "installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    [ "$SLURM_GENERATION" = 22.05 ] || install_trixie_slurm
}

# Slurm 24.11 from Debian 13 (trixie) beside Debian 12's: its packages and every library they need, downloaded
# with an apt configuration of this testbed's own (an empty package status, so apt fetches the whole closure),
# unpacked under $ROOT; every executable then loads $ROOT's loader and libraries, and every library looks in
# $ROOT first (patchelf). The daemons and clients get their usual names in $CACHE/slurm-24.11/{sbin,bin}.
install_trixie_slurm() {
    local top=$CACHE/slurm-24.11
    if [ -x "$top/sbin/slurmd" ] && [ -s "$top/installed" ]; then
        log "Slurm $(cat "$top/installed") already installed in $top"
        return
    fi
    local apt=$top/apt
    mkdir -p "$apt"/{lists/partial,cache/archives/partial,state}
    : >"$apt/status"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
        >"$apt/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
        -o "Dir::State=$apt/state" -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
        -o "Dir::State::status=$apt/status" -o Debug::NoLocking=1 -o APT::Architecture=amd64)
    log "downloading Debian 13's Slurm 24.11 and its libraries into $apt"
    apt-get "${opts[@]}" update -qq
    apt-get "${opts[@]}" install -qq -y --download-only --no-install-recommends \
        slurmd slurmctld slurm-client slurmdbd >/dev/null
    rm -rf "$ROOT" "$top/bin" "$top/sbin" "$top/installed"
    mkdir -p "$ROOT" "$top/bin" "$top/sbin"
    for deb in "$apt"/cache/archives/*.deb; do dpkg-deb -x "$deb" "$ROOT"; done
    local loader=$LIBS/ld-linux-x86-64.so.2 search=$PLUGIN_DIR:$LIBS file
    for file in "$ROOT"/usr/bin/* "$ROOT"/usr/sbin/*; do
        [ -f "$file" ] && [ ! -L "$file" ] && [ "$(head -c4 "$file" | tail -c3)" = ELF ] || continue
        # DT_RPATH (forced), not RUNPATH: it also applies to what the plugins that Slurm dlopen()s need.
        patchelf --set-interpreter "$loader" --force-rpath --set-rpath "$search" "$file"
    done
    while IFS= read -r file; do
        case $file in */ld-linux-x86-64.so.2 | */libc.so.6) continue ;; esac
        [ "$(head -c4 "$file" | tail -c3)" = ELF ] || continue
        patchelf --set-rpath "$search" "$file"
    done < <(find "$LIBS" -type f -name '*.so*')
    for name in "${CLIENTS[@]}"; do ln -s "$ROOT/usr/bin/$name" "$top/bin/$name"; done
    for name in slurmctld slurmd slurmdbd slurmstepd; do
        local built=$ROOT/usr/sbin/$name
        [ -e "$built" ] || built=$ROOT/usr/sbin/$name-wlm  # Debian's alternatives name them slurmd-wlm, ...
        ln -s "$built" "$top/sbin/$name"
    done
    dpkg-deb -f "$(ls "$apt"/cache/archives/slurmd_*.deb)" Version >"$top/installed"  # written last: a whole install
    log "installed Slurm $(cat "$top/installed") in $top"
}

write_configs() {
    mkdir -p "$STATE"/{ctld,spool,log,run,mysql,dev} "$CONF_DIR"
    for g in $(seq 0 $((GPUS - 1))); do
        # The same major/minor as /dev/null: slurmd only needs a device file to hand out.
        [ -c "$STATE/dev/gpu$g" ] || mknod "$STATE/dev/gpu$g" c 1 3
    done
    if [ -f "$CONF" ] && ! grep -q "^$TAG" "$CONF"; then
        die "$CONF exists and was not written by this testbed; move it away first"
    fi
    {
        echo "$TAG: generated by slurm/testbed.sh; removed by nothing, rewritten by every start"
        echo "ClusterName=$CLUSTER"
        [ -z "$PLUGIN_DIR" ] || echo "PluginDir=$PLUGIN_DIR"
        echo "SlurmctldHost=$CTL_HOST($SUBNET.1)"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "AuthType=auth/munge"
        # Credentials expire fast, so a requeued job restarts in seconds instead of minutes.
        echo "AuthInfo=cred_expire=5"
        echo "StateSaveLocation=$STATE/ctld"
        echo "SlurmdSpoolDir=$STATE/spool/%n"
        echo "SlurmctldPidFile=$STATE/run/slurmctld.pid"
        echo "SlurmdPidFile=$STATE/run/slurmd-%n.pid"
        echo "SlurmctldLogFile=$STATE/log/slurmctld.log"
        echo "SlurmdLogFile=$STATE/log/slurmd-%n.log"
        # No cgroups on these machines: track processes by their parent pids, bind nothing.
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core_Memory"
        echo "SlurmdParameters=config_overrides"
        echo "ReturnToService=2"
        echo "JobRequeue=1"
        echo "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=2,bf_interval=1"
        echo "KillWait=5"
        echo "MinJobAge=300"
        echo "MpiDefault=none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/slurmdbd"
        echo "AccountingStorageHost=localhost"
        echo "GresTypes=gpu"
        for i in $(seq 1 "$NODES"); do
            echo "NodeName=node$i NodeAddr=$SUBNET.$((10 + i)) CPUs=$CPUS RealMemory=$MEM_MB Weight=1 State=UNKNOWN"
        done
        for i in $(seq $((NODES + 1)) "$TOTAL"); do
            echo "NodeName=node$i NodeAddr=$SUBNET.$((10 + i)) CPUs=$GPU_CPUS RealMemory=$GPU_MEM_MB Gres=gpu:tesla:$GPUS Weight=10 State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP"
        if [ "$GPU_NODES" -gt 0 ]; then
            echo "PartitionName=gpu Nodes=node[$((NODES + 1))-$TOTAL] MaxTime=$GPU_MAX_TIME State=UP"
            # Every node: a job of 2 nodes + 1 spare (cluster.slurm.spare_nodes=1). Weights make Slurm fill the CPU
            # nodes first, so a 2-node job without spares lands on node1 and node2.
            echo "PartitionName=all Nodes=node[1-$TOTAL] MaxTime=INFINITE State=UP"
        fi
    } >"$CONF"
    {
        echo "$TAG"
        for i in $(seq $((NODES + 1)) "$TOTAL"); do
            echo "NodeName=node$i Name=gpu Type=tesla File=$STATE/dev/gpu[0-$((GPUS - 1))]"
        done
    } >"$GRES_CONF"
    {
        echo "$TAG"
        [ -z "$PLUGIN_DIR" ] || echo "PluginDir=$PLUGIN_DIR"
        echo "AuthType=auth/munge"
        echo "DbdHost=localhost"
        echo "SlurmUser=root"
        echo "StorageType=accounting_storage/mysql"
        echo "StorageHost=localhost"
        echo "StorageUser=root"
        echo "StorageLoc=slurm_acct_db"
        echo "LogFile=$STATE/log/slurmdbd.log"
        echo "PidFile=$STATE/run/slurmdbd.pid"
    } >"$DBD_CONF"
    chmod 600 "$DBD_CONF"
}

start_munge() {
    if alive "$(pid_of /run/munge/munged.pid)" munged; then return; fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    chmod 755 /run/munge
    [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; }
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    runuser -u munge -- /usr/sbin/munged --force
    wait_for "munged" 10 sh -c 'munge -n | unmunge'
}

start_mariadb() {
    if alive "$(pid_of "$STATE/run/mysqld.pid")" mariadbd; then return; fi
    if [ ! -d "$STATE/mysql/mysql" ]; then
        mariadb-install-db --user=root --datadir="$STATE/mysql" --auth-root-authentication-method=socket \
            --skip-test-db >"$STATE/log/mysql-install.log" 2>&1
    fi
    # Socket only, data in the testbed folder: it never touches a MariaDB the machine may run for itself.
    setsid mariadbd --user=root --datadir="$STATE/mysql" --socket="$SOCKET" --skip-networking \
        --pid-file="$STATE/run/mysqld.pid" --log-error="$STATE/log/mysqld.log" </dev/null >/dev/null 2>&1 &
    wait_for "MariaDB" 60 mariadb-admin --socket="$SOCKET" ping
}

start_slurmdbd() {
    if alive "$(pid_of "$STATE/run/slurmdbd.pid")" slurmdbd; then return; fi
    MYSQL_UNIX_PORT=$SOCKET slurmdbd
    wait_for "slurmdbd" 30 sacctmgr -n list cluster
    sacctmgr -i add cluster "$CLUSTER" >/dev/null 2>&1 || true
}

setup_network() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip addr add "$SUBNET.1/24" dev "$BRIDGE"
    fi
    ip link set "$BRIDGE" up
    for i in $(seq 1 "$TOTAL"); do
        local ns=hpctb-node$i
        if ! ip netns list | grep -qw "$ns"; then
            ip netns add "$ns"
            ip link add "hpctbv$i" type veth peer name eth0 netns "$ns"
            ip link set "hpctbv$i" master "$BRIDGE" up
            ip -n "$ns" addr add "$SUBNET.$((10 + i))/24" dev eth0
            ip -n "$ns" link set eth0 up
            ip -n "$ns" link set lo up
        fi
        grep -q "^$SUBNET.$((10 + i)) node$i $TAG" /etc/hosts || echo "$SUBNET.$((10 + i)) node$i $TAG" >>/etc/hosts
    done
}

FRESH_CONTROLLER=0

start_slurmctld() {
    if alive "$(pid_of "$STATE/run/slurmctld.pid")" slurmctld; then
        scontrol reconfigure >/dev/null
        return
    fi
    slurmctld -i
    FRESH_CONTROLLER=1
    wait_for "slurmctld" 30 scontrol ping
}

# A controller started from saved state brings back the jobs of the last testbed, e.g. one whose machine was
# snapshotted or rebooted mid-run. Their processes are gone, but they hold the nodes and the tests would queue
# behind them, so cancel them. A controller that was already up keeps its jobs: `start` is idempotent.
cancel_leftover_jobs() {
    [ "$FRESH_CONTROLLER" = 1 ] || return 0
    local jobs
    jobs=$(squeue -h -o %A 2>/dev/null | tr '\n' ' ')
    [ -n "${jobs// /}" ] || return 0
    log "cancelling jobs left from the previous testbed: $jobs"
    # shellcheck disable=SC2086  # one argument per job id
    scancel --full --quiet $jobs 2>/dev/null || true
    local deadline=$((SECONDS + 30))
    while [ -n "$(squeue -h 2>/dev/null)" ] && [ $SECONDS -lt $deadline ]; do sleep 0.5; done
}

start_slurmd() {
    for i in $(seq 1 "$TOTAL"); do
        if alive "$(pid_of "$STATE/run/slurmd-node$i.pid")" slurmd; then continue; fi
        mkdir -p "$STATE/spool/node$i"
        # Own network namespace and hostname. Not `ip netns exec`: it remounts /sys and slurmd then dies with
        # "No filesystem mounted on /sys/fs/cgroup".
        if [ "$SLURM_GENERATION" = 22.05 ]; then
            nsenter --net="/run/netns/hpctb-node$i" unshare --uts sh -c "hostname node$i && exec slurmd -N node$i"
        else  # its own mount namespace too, where /usr/sbin/slurmstepd (the path slurmd was built with) is 24.11's
            nsenter --net="/run/netns/hpctb-node$i" unshare --uts --mount --propagation private sh -c \
                "mount --bind '$CACHE/slurm-24.11/sbin/slurmstepd' /usr/sbin/slurmstepd && hostname node$i && exec slurmd -N node$i"
        fi
    done
}

nodes_idle() {
    local states
    states=$(sinfo -h -N -o "%T" 2>/dev/null | sort -u | tr '\n' ' ')
    [ "$states" = "idle " ]
}

cmd_start() {
    need_root
    command -v slurmctld >/dev/null && command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null ||
        die "Slurm $SLURM_GENERATION, slurmdbd or MariaDB is not installed: run 'HPC_TESTBED_SLURM=$SLURM_GENERATION $0 install' first"
    if alive "$(pid_of "$OTHER_STATE/run/slurmctld.pid")" slurmctld; then
        die "the other Slurm generation's testbed runs (state in $OTHER_STATE): stop it first (its nodes, ports and munge are these)"
    fi
    local t0=$SECONDS
    write_configs
    start_munge
    start_mariadb
    start_slurmdbd
    setup_network
    start_slurmctld
    start_slurmd
    cancel_leftover_jobs
    local deadline=$((SECONDS + 60))
    until nodes_idle; do
        # A node that was down (e.g. after a stop) returns with ReturnToService=2; nudge it if it lingers.
        scontrol update nodename="node[1-$TOTAL]" state=resume >/dev/null 2>&1 || true
        [ $SECONDS -lt $deadline ] || { sinfo -N >&2; die "nodes did not become idle within 60s (logs: $STATE/log)"; }
        sleep 0.5
    done
    log "up in $((SECONDS - t0))s: $(sinfo --version), controller $CTL_HOST ($SUBNET.1), nodes node[1-$TOTAL] (partition gpu: $GPU_NODES with $GPUS GPUs), accounting on"
}

kill_pidfile() {
    local file=$1 what=$2 name=$3 pid
    pid=$(pid_of "$file")
    if alive "$pid" "$name"; then
        kill "$pid" 2>/dev/null || true
        local deadline=$((SECONDS + 15))
        while alive "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
        if alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
        log "stopped $what"
    fi
    rm -f "$file"
}

cmd_stop_dbd() {
    need_root
    kill_pidfile "$STATE/run/slurmdbd.pid" slurmdbd slurmdbd
}

cmd_stop() {
    need_root
    # Jobs first: stopping slurmd leaves running jobs alive.
    if alive "$(pid_of "$STATE/run/slurmctld.pid")" slurmctld; then
        scancel --full --quiet --state=PENDING,RUNNING,SUSPENDED,REQUEUED $(squeue -h -o %A 2>/dev/null) 2>/dev/null || true
        local deadline=$((SECONDS + 30))
        while [ -n "$(squeue -h -t PD,R,CG,S 2>/dev/null)" ] && [ $SECONDS -lt $deadline ]; do sleep 0.5; done
    fi
    for i in $(seq 1 "$TOTAL"); do kill_pidfile "$STATE/run/slurmd-node$i.pid" "slurmd node$i" slurmd; done
    kill_pidfile "$STATE/run/slurmctld.pid" slurmctld slurmctld
    kill_pidfile "$STATE/run/slurmdbd.pid" slurmdbd slurmdbd
    if alive "$(pid_of "$STATE/run/mysqld.pid")" mariadbd; then
        mariadb-admin --socket="$SOCKET" shutdown 2>/dev/null || kill_pidfile "$STATE/run/mysqld.pid" MariaDB mariadbd
        log "stopped MariaDB"
    fi
    kill_pidfile /run/munge/munged.pid munged munged
    for i in $(seq 1 "$TOTAL"); do
        ip netns del "hpctb-node$i" 2>/dev/null || true
        ip link del "hpctbv$i" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    if grep -q "$TAG" /etc/hosts; then
        # /etc/hosts may be a bind mount: rewrite it in place rather than replacing the file.
        local kept
        kept=$(grep -v "$TAG" /etc/hosts)
        printf '%s\n' "$kept" >/etc/hosts
    fi
    log "stopped; state kept in $STATE"
}

cmd_status() {
    local name file
    for pair in munged:/run/munge/munged.pid mariadbd:$STATE/run/mysqld.pid slurmdbd:$STATE/run/slurmdbd.pid \
        slurmctld:$STATE/run/slurmctld.pid; do
        name=${pair%%:*} file=${pair#*:}
        if alive "$(pid_of "$file")" "$name"; then echo "$name: running"; else echo "$name: stopped"; fi
    done
    for i in $(seq 1 "$TOTAL"); do
        if alive "$(pid_of "$STATE/run/slurmd-node$i.pid")" slurmd; then echo "slurmd node$i: running"; else echo "slurmd node$i: stopped"; fi
    done
    sinfo -N 2>/dev/null || true
}

# What a shell (or hpc_train) needs to drive this generation as it would a cluster: its clients first on PATH,
# and its config. For `eval "$(slurm/testbed.sh env)"`.
cmd_env() {
    if [ "$SLURM_GENERATION" = 22.05 ]; then
        echo "export SLURM_CONF=$CONF"
    else
        printf 'export PATH=%q:"$PATH"\n' "$CACHE/slurm-24.11/bin"
        printf 'export SLURM_CONF=%q\n' "$CONF"
    fi
}

case ${1:-} in
install) cmd_install ;;
env) cmd_env ;;
start) cmd_start ;;
stop) cmd_stop ;;
stop-dbd) cmd_stop_dbd ;;
start-dbd) need_root && start_slurmdbd ;;
status) cmd_status ;;
*) die "usage: [HPC_TESTBED_SLURM=22.05|24.11] $0 install|start|stop|status|env|stop-dbd|start-dbd" ;;
esac
