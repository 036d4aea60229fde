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
# Ray token authentication is on (RAY_AUTH_MODE=token): `head` creates ~/.ray/auth_token if missing;
# copy that file to every worker node (or export RAY_AUTH_TOKEN there) before `worker`.
# RAY_AUTH_MODE=disabled turns it off. The GCS port (RAY_PORT) must be reachable from the workers.
#
# Environment: RAY_PORT [6379], DASHBOARD_HOST [127.0.0.1], DASHBOARD_PORT [8265], NODE_IP [Ray's
# guess], NUM_GPUS [all visible], RAY_AUTH_MODE [token], NNODES for `submit` [alive nodes with GPUs],
# PRINT_ONLY=1 prints the commands instead of running them.
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
        if [[ "$RAY_AUTH_MODE" == "token" ]]; then run "$RAY" get-auth-token --generate >/dev/null; fi
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
