#!/usr/bin/env bash
# The demo, as far as the product goes today:
# 1. two real processes exchange requests through the shared-memory ring;
#    the ring benchmark prints round trips (spinning, parked), a 221 x 128
#    f32 neighbourhood written in place against the same bytes over a Unix
#    socket, and the ratios;
# 2. a seeded 50M-edge power-law graph is generated, imported and sampled;
#    the graph benchmark prints the build rate, the sampling throughput and
#    super-node against ordinary-node latency.
# Pass --quick for a short run. Installs what is missing first; safe to run
# again.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo bench -p tests --bench ring -- "$@"
cargo bench -p sidecar --bench graph -- "$@"
