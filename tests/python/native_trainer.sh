#!/bin/bash
# A trainer that is not Python: it speaks the agent's progress protocol (JSON lines appended to
# GOODPUT_PROGRESS_FILE) from bash and never registers a stack-dump signal, so the agent can only
# show where it hangs with native stacks (gdb, or py-spy where installed).
p="$GOODPUT_PROGRESS_FILE"
echo '{"event":"started"}' >> "$p"
echo '{"event":"rendezvous"}' >> "$p"
echo '{"event":"loaded","step":0,"tier":"none","seconds":0}' >> "$p"
for ((s = 1; s <= GOODPUT_TOTAL_STEPS; s++)); do
  sleep 0.05
  echo "{\"event\":\"step\",\"step\":$s}" >> "$p"
done
echo "{\"event\":\"done\",\"step\":$GOODPUT_TOTAL_STEPS}" >> "$p"
