#!/usr/bin/env bash
# Start a Ray cluster for the RPG runs and submit a paper script to it (docs/launch-scripts.md).
#
#   recipe/rpg/ray_cluster.sh head                      # on the head node
#   recipe/rpg/ray_cluster.sh worker HEAD_IP[:PORT]     # on every other node
#   recipe/rpg/ray_cluster.sh submit recipe/rpg/4b/run_rpg_4b_ctx8k_urkl1e-4_rf_clip_ppo_0.2_0.28.sh [overrides]
#   recipe/rpg/ray_cluster.sh status | stop             # `ray status` / `ray stop` (this node only)
#
# Arguments after `head` / `worker HEAD` go to `ray start` (e.g. --num-cpus=8 --temp-dir=DIR); with --block
# this script becomes `ray start` (exec): the PID that started it is the node's, SIGTERM to it stops the node.
# Two nodes on one machine (a rehearsal before a cluster): docs/launch-scripts.md, section 6.
#
# Safe defaults: the dashboard and its job-submission API listen on 127.0.0.1 only (anyone who can
# reach that port can run code on the cluster). From your laptop use an SSH tunnel:
#     ssh -L 8265:localhost:8265 user@HEAD     then open http://localhost:8265
# DASHBOARD_HOST=0.0.0.0 exposes it to the network (only on a trusted, firewalled network).
# Ray token authentication is on (RAY_AUTH_MODE=token): `head` creates ~/.ray/auth_token if missing,
# readable by you only (0600; an existing one is set to 0600 too); copy that file to every worker
# node (chmod 600; `worker` checks it is there and private) or export RAY_AUTH_TOKEN there.
# RAY_AUTH_MODE=disabled turns it off; any other value (a typo, another case) is refused. With it off,
# a DASHBOARD_HOST other than loopback (127.x, ::1, localhost) is refused unless
# ALLOW_UNAUTHENTICATED_DASHBOARD=1 (then a warning): anyone on the network could run code. The GCS
# port (RAY_PORT) must be reachable from the workers.
# The job API's address follows DASHBOARD_HOST: http://127.0.0.1:PORT for 127.0.0.1, 0.0.0.0 or ::
# (every interface: this node's loopback is one), else http://DASHBOARD_HOST:PORT ([...] around an
# IPv6 address); `head` prints it and `submit` uses it. `submit` first asks the cluster for its nodes:
# no cluster there, or one that refuses this client's token, is one line and exit 2.
#
# Environment: RAY_PORT [6379], DASHBOARD_HOST [127.0.0.1], DASHBOARD_PORT [8265], NODE_IP [Ray's
# guess], NUM_GPUS [all visible], RAY_AUTH_MODE [token], RAY_AUTH_TOKEN_PATH [~/.ray/auth_token],
# ALLOW_UNAUTHENTICATED_DASHBOARD [0], RAY_ADDRESS for `submit` [the job API's address above],
# NNODES for `submit` [alive nodes with GPUs], PRINT_ONLY=1 prints every step that would run instead
# of running it: the token steps and the variables this script sets for the commands (`export ...`)
# too, never the token; the checks run as in a real run, and the printed lines, pasted into a
# shell (`bash -eu`), do exactly what the run would.
set -euo pipefail

RAY="${RAY:-ray}"
RAY_PORT="${RAY_PORT:-6379}"
DASHBOARD_HOST="${DASHBOARD_HOST:-127.0.0.1}"
DASHBOARD_PORT="${DASHBOARD_PORT:-8265}"
# `submit` counts the alive nodes with GPUs with it (standard library only, run by path): one line
# instead of Ray's tracebacks when no cluster answers or it refuses this client.
NODES_PY="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/rpg/cluster/ray_job_api.py"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

# flag NAME: 1 for 1/true/yes/on, 0 for 0/false/no/off or empty; anything else is refused before anything runs.
flag() {
    case "$(printf '%s' "${!1:-0}" | tr '[:upper:]' '[:lower:]')" in
        1|true|yes|on) echo 1 ;;
        0|false|no|off) echo 0 ;;
        *) echo "ray_cluster.sh: $1='${!1}' is invalid; allowed values: 1, 0, true, false" >&2; exit 2 ;;
    esac
}
PRINT_ONLY_ON="$(flag PRINT_ONLY)"
ALLOW_UNAUTHENTICATED_ON="$(flag ALLOW_UNAUTHENTICATED_DASHBOARD)"
print_only() { [[ "$PRINT_ONLY_ON" == "1" ]]; }

# quote WORD...: the words as one shell-quoted line.
quote() { local q; q="$(printf '%q ' "$@")"; printf '%s' "${q% }"; }

# Every step goes through run, run_line or set_env, and every decision before a step is the same in
# both modes (it never depends on a step having run), so PRINT_ONLY=1 prints exactly what would run.
run() {
    if print_only; then printf '%s\n' "$(quote "$@")"; else "$@"; fi
}

# run_line LINE: like run, for a shell line (a subshell, a redirection); its words are already quoted.
run_line() {
    if print_only; then printf '%s\n' "$1"; else eval "$1"; fi
}

# run_node ARGS...: `ray start ARGS`; with --block (the node runs in the foreground until a signal) this
# script's process becomes `ray start` itself (exec), so the PID a caller recorded is the node's: SIGTERM to it
# stops every process of the node.
run_node() {
    if ! print_only && [[ " $* " == *" --block "* ]]; then exec "$@"; fi
    run "$@"
}

# set_env NAME VALUE: export a variable for the commands that follow (printed as `export NAME=VALUE`).
set_env() {
    export "$1=$2"
    if print_only; then printf 'export %s=%s\n' "$1" "$(quote "$2")"; fi
}

# say MESSAGE: a message (a comment in the PRINT_ONLY output).
say() {
    if print_only; then printf '# %s\n' "$*"; else printf '%s\n' "$*"; fi
}

die() { echo "[ray_cluster] error: $*" >&2; exit 2; }

token_file() { printf '%s\n' "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}"; }

# The token file is a credential: 0600. Ray writes a new one with open(), i.e. with the umask
# (0644 by default), so it is created under umask 077, and an existing one is set to 0600.
# Ray reads RAY_AUTH_TOKEN, then RAY_AUTH_TOKEN_PATH (an error if that file is missing or empty),
# then ~/.ray/auth_token; `get-auth-token --generate` writes only ~/.ray/auth_token, and only when
# it finds no token (with RAY_AUTH_TOKEN set it writes nothing: nothing to chmod unless the file exists).
head_token() {
    local file
    file="$(token_file)"
    if [[ -z "${RAY_AUTH_TOKEN:-}" && -n "${RAY_AUTH_TOKEN_PATH:-}" && ! -s "$file" ]]; then
        die "RAY_AUTH_TOKEN_PATH=$file holds no token (missing or empty), and Ray generates one only at" \
            "~/.ray/auth_token: put the token there (chmod 600), or unset RAY_AUTH_TOKEN_PATH"
    fi
    run_line "(umask 077 && $(quote "$RAY") get-auth-token --generate >/dev/null)"
    if [[ -z "${RAY_AUTH_TOKEN:-}" || -e "$file" ]]; then
        run_line "chmod 600 $(quote "$file")"
    fi
}

worker_token() {
    local file
    file="$(token_file)"
    if [[ -z "${RAY_AUTH_TOKEN:-}" && ! -s "$file" ]]; then
        die "no Ray token at $file and RAY_AUTH_TOKEN is not set: copy ~/.ray/auth_token" \
            "from the head node (chmod 600), or set RAY_AUTH_MODE=disabled"
    fi
    if [[ -e "$file" ]]; then
        run_line "chmod 600 $(quote "$file")"
    fi
}

# job_host: the host in the job API's address: DASHBOARD_HOST, 127.0.0.1 for every interface (0.0.0.0, ::),
# an IPv6 address in brackets.
job_host() {
    local h="${DASHBOARD_HOST#\[}"
    h="${h%\]}"
    case "$h" in
        0.0.0.0|::) printf '127.0.0.1' ;;
        *:*) printf '[%s]' "$h" ;;
        *) printf '%s' "$h" ;;
    esac
}

loopback() { case "$1" in 127.*|localhost|::1|"[::1]") return 0 ;; *) return 1 ;; esac; }

# Authentication off with the job API (it runs any code) on the network: only when asked for by name.
check_open_dashboard() {
    [[ "$RAY_AUTH_MODE" == "disabled" ]] && ! loopback "$DASHBOARD_HOST" || return 0
    if [[ "$ALLOW_UNAUTHENTICATED_ON" != "1" ]]; then
        die "RAY_AUTH_MODE=disabled with DASHBOARD_HOST=$DASHBOARD_HOST would let anyone who reaches port" \
            "$DASHBOARD_PORT run code on the cluster: keep RAY_AUTH_MODE=token, or DASHBOARD_HOST=127.0.0.1" \
            "(ssh -L), or set ALLOW_UNAUTHENTICATED_DASHBOARD=1 (trusted, firewalled network only)"
    fi
    echo "[ray_cluster] warning: the job API on $DASHBOARD_HOST:$DASHBOARD_PORT has no authentication" \
         "(ALLOW_UNAUTHENTICATED_DASHBOARD=1): anyone who reaches it can run code on the cluster" >&2
}

node_args() {
    local args=()
    [[ -n "${NODE_IP:-}" ]] && args+=(--node-ip-address="$NODE_IP")
    [[ -n "${NUM_GPUS:-}" ]] && args+=(--num-gpus="$NUM_GPUS")
    if [[ ${#args[@]} -gt 0 ]]; then printf '%s\n' "${args[@]}"; fi
}

head_messages() {
    say "[ray_cluster] head started; workers: recipe/rpg/ray_cluster.sh worker <this node's IP>:$RAY_PORT"
    local jobs
    jobs="RAY_ADDRESS=http://$(job_host):$DASHBOARD_PORT"
    if loopback "$DASHBOARD_HOST"; then
        say "[ray_cluster] jobs: $jobs (on this node, or through ssh -L $DASHBOARD_PORT:localhost:$DASHBOARD_PORT)"
    elif [[ "$(job_host)" == 127.0.0.1 ]]; then
        say "[ray_cluster] jobs: $jobs on this node, http://<this node's IP>:$DASHBOARD_PORT from the network"
    else
        say "[ray_cluster] jobs: $jobs (submit's default with the same DASHBOARD_HOST)"
    fi
}

cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
    head|worker|submit|status|stop)
        # Ray's two modes, spelled exactly: a typo must not turn authentication off (the token steps below
        # run for "token" only) nor skip the 0600 token file (Ray itself reads "TOKEN" as token mode).
        case "${RAY_AUTH_MODE:-token}" in
            token|disabled) ;;
            *) echo "ray_cluster.sh: RAY_AUTH_MODE='${RAY_AUTH_MODE}' is invalid; allowed values: token (the default), disabled" >&2
               exit 2 ;;
        esac
        set_env RAY_AUTH_MODE "${RAY_AUTH_MODE:-token}" ;;
esac
case "$cmd" in
    head)
        check_open_dashboard
        if [[ "$RAY_AUTH_MODE" == "token" ]]; then head_token; fi
        mapfile -t extra < <(node_args)
        blocks=0; [[ " $* " == *" --block "* ]] && blocks=1  # the messages first: a blocking start never returns
        [[ $blocks == 1 ]] && head_messages
        run_node "$RAY" start --head --port="$RAY_PORT" --dashboard-host="$DASHBOARD_HOST" \
            --dashboard-port="$DASHBOARD_PORT" "${extra[@]+"${extra[@]}"}" "$@"
        [[ $blocks == 1 ]] || head_messages
        ;;
    worker)
        head="${1:?usage: ray_cluster.sh worker HEAD_IP[:PORT]}"
        shift
        [[ "$head" == *:* ]] || head="$head:$RAY_PORT"
        if [[ "$RAY_AUTH_MODE" == "token" ]]; then worker_token; fi
        mapfile -t extra < <(node_args)
        run_node "$RAY" start --address="$head" "${extra[@]+"${extra[@]}"}" "$@"
        ;;
    submit)
        script="${1:?usage: ray_cluster.sh submit SCRIPT [hydra overrides]}"
        shift
        set_env RAY_ADDRESS "${RAY_ADDRESS:-http://$(job_host):$DASHBOARD_PORT}"
        if [[ -z "${NNODES:-}" ]]; then
            run_line "NNODES=\"\$($(quote "${PYTHON:-python3}") $(quote "$NODES_PY") $(quote "$RAY") \"\$RAY_ADDRESS\")\""
            run_line "export NNODES"
            print_only || say "[ray_cluster] NNODES=$NNODES (alive nodes with GPUs)"
        fi
        run bash "$script" "$@"
        ;;
    status) run "$RAY" status "$@" ;;
    stop) run "$RAY" stop "$@" ;;
    -h|--help|help) usage ;;
    *) usage >&2; exit 2 ;;
esac
