#!/usr/bin/env bash
# Start a Ray cluster for the RPG runs and submit a paper script to it (docs/launch-scripts.md).
#
#   recipe/rpg/ray_cluster.sh head                      # on the head node
#   recipe/rpg/ray_cluster.sh worker HEAD_IP[:PORT]     # on every other node
#   recipe/rpg/ray_cluster.sh submit recipe/rpg/4b/run_rpg_4b_ctx8k_urkl1e-4_rf_clip_ppo_0.2_0.28.sh [overrides]
#   recipe/rpg/ray_cluster.sh status | stop             # `ray status` / `ray stop` (this node only)
#
# Safe defaults: the dashboard and its job-submission API listen on 127.0.0.1 only (anyone who can
# reach that port can run code on the cluster). From your laptop use an SSH tunnel:
#     ssh -L 8265:localhost:8265 user@HEAD     then open http://localhost:8265
# DASHBOARD_HOST=0.0.0.0 exposes it to the network (only on a trusted, firewalled network).
# Ray token authentication is on (RAY_AUTH_MODE=token): `head` creates ~/.ray/auth_token if missing,
# readable by you only (0600; an existing one is set to 0600 too); copy that file to every worker
# node (chmod 600; `worker` checks it is there and private) or export RAY_AUTH_TOKEN there.
# RAY_AUTH_MODE=disabled turns it off. The GCS port (RAY_PORT) must be reachable from the workers.
#
# Environment: RAY_PORT [6379], DASHBOARD_HOST [127.0.0.1], DASHBOARD_PORT [8265], NODE_IP [Ray's
# guess], NUM_GPUS [all visible], RAY_AUTH_MODE [token], RAY_AUTH_TOKEN_PATH [~/.ray/auth_token],
# NNODES for `submit` [alive nodes with GPUs], PRINT_ONLY=1 prints every command that would run
# (the token steps too; never the token) instead of running it.
set -euo pipefail

RAY="${RAY:-ray}"
RAY_PORT="${RAY_PORT:-6379}"
DASHBOARD_HOST="${DASHBOARD_HOST:-127.0.0.1}"
DASHBOARD_PORT="${DASHBOARD_PORT:-8265}"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

run() {
    if [[ "${PRINT_ONLY:-0}" == "1" ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}

# run_line LINE: like run, for a shell line (a subshell, a redirection); its words are already quoted.
run_line() {
    if [[ "${PRINT_ONLY:-0}" == "1" ]]; then printf '%s\n' "$1"; else eval "$1"; fi
}

token_file() { printf '%s\n' "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}"; }

# The token file is a credential: 0600. Ray writes a new one with open(), i.e. with the umask
# (0644 by default), so it is created under umask 077, and an existing one is set to 0600.
head_token() {
    local file
    file="$(token_file)"
    run_line "(umask 077 && $(printf '%q' "$RAY") get-auth-token --generate >/dev/null)"
    if [[ -z "${RAY_AUTH_TOKEN:-}" || -e "$file" || "${PRINT_ONLY:-0}" == "1" ]]; then
        run_line "chmod 600 $(printf '%q' "$file")"
    fi
}

worker_token() {
    local file
    file="$(token_file)"
    if [[ -e "$file" || "${PRINT_ONLY:-0}" == "1" ]]; then
        run_line "chmod 600 $(printf '%q' "$file")"
    elif [[ -z "${RAY_AUTH_TOKEN:-}" ]]; then
        echo "[ray_cluster] error: no Ray token at $file and RAY_AUTH_TOKEN is not set: copy ~/.ray/auth_token" \
            "from the head node (chmod 600), or set RAY_AUTH_MODE=disabled" >&2
        exit 2
    fi
}

node_args() {
    local args=()
    [[ -n "${NODE_IP:-}" ]] && args+=(--node-ip-address="$NODE_IP")
    [[ -n "${NUM_GPUS:-}" ]] && args+=(--num-gpus="$NUM_GPUS")
    if [[ ${#args[@]} -gt 0 ]]; then printf '%s\n' "${args[@]}"; fi
}

cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
    head)
        if [[ "$RAY_AUTH_MODE" == "token" ]]; then head_token; fi
        mapfile -t extra < <(node_args)
        run "$RAY" start --head --port="$RAY_PORT" --dashboard-host="$DASHBOARD_HOST" \
            --dashboard-port="$DASHBOARD_PORT" "${extra[@]+"${extra[@]}"}" "$@"
        echo "[ray_cluster] head started; workers: recipe/rpg/ray_cluster.sh worker <this node's IP>:$RAY_PORT"
        echo "[ray_cluster] jobs: RAY_ADDRESS=http://127.0.0.1:$DASHBOARD_PORT (on this node, or through ssh -L $DASHBOARD_PORT:localhost:$DASHBOARD_PORT)"
        ;;
    worker)
        head="${1:?usage: ray_cluster.sh worker HEAD_IP[:PORT]}"
        shift
        [[ "$head" == *:* ]] || head="$head:$RAY_PORT"
        if [[ "$RAY_AUTH_MODE" == "token" ]]; then worker_token; fi
        mapfile -t extra < <(node_args)
        run "$RAY" start --address="$head" "${extra[@]+"${extra[@]}"}" "$@"
        ;;
    submit)
        script="${1:?usage: ray_cluster.sh submit SCRIPT [hydra overrides]}"
        shift
        export RAY_ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:$DASHBOARD_PORT}"
        if [[ -z "${NNODES:-}" && "${PRINT_ONLY:-0}" != "1" ]]; then
            NNODES="$("$RAY" list nodes --address "$RAY_ADDRESS" --format json | "${PYTHON:-python3}" -c \
                'import json, sys; print(sum(1 for n in json.load(sys.stdin) if n["state"] == "ALIVE" and float(n["resources_total"].get("GPU", 0)) > 0) or 1)')"
            export NNODES
            echo "[ray_cluster] NNODES=$NNODES (alive nodes with GPUs)"
        fi
        run bash "$script" "$@"
        ;;
    status) run "$RAY" status "$@" ;;
    stop) run "$RAY" stop "$@" ;;
    -h|--help|help) usage ;;
    *) usage >&2; exit 2 ;;
esac
