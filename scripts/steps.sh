# Sourced by the GPU-machine scripts (h200.sh, h200x2.sh, h200_accuracy.sh): the step helpers.
# The caller sets R (results folder), STEP_TAG (log prefix), steps (the steps asked for) and,
# for a run that must end within a budget, DEADLINE (in $SECONDS); STEP_TAIL lines of each
# step's log are echoed (default 25).
want() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
log() { echo "[$STEP_TAG $(date +%H:%M:%S)] $*" | tee -a "$R/run.log"; }
run() {  # run NAME TIMEOUT CMD...: output to $R/NAME.log, status and wall time to run.log
  local name=$1 t=$2; shift 2
  if [ -n "${DEADLINE:-}" ]; then  # leave room to write the archive; skip what cannot start
    local left=$((DEADLINE - SECONDS - 15))
    if [ "$left" -lt 20 ]; then log "skip $name: budget spent"; return 124; fi
    [ "$t" -gt "$left" ] && t=$left
  fi
  log "start $name: $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$t" "$@" >"$R/$name.log" 2>&1
  local rc=$?
  log "end $name rc=$rc ($((SECONDS - t0)) s)"
  tail -n "${STEP_TAIL:-25}" "$R/$name.log"
  return $rc
}
