#!/usr/bin/env bash
# The demo, as far as the product goes today: two real processes exchange
# requests through the shared-memory ring, and the ring benchmark prints
# round trips (spinning, parked), a 221 x 128 f32 neighbourhood written in
# place against the same bytes over a Unix socket, and the ratios.
# Installs what is missing first; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo bench -p tests --bench ring -- "$@"
