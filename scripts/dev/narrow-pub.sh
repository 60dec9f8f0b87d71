#!/bin/sh
# Narrows `pub` to what the library's API and `atou::internals` reach
# (src/lib.rs). Mechanical, so it is re-run on a merged tree rather than
# merged by hand:
#   1. the CLI lives in the library (`mod cli` in src/lib.rs): its
#      `atou::` paths become `crate::`;
#   2. `cargo fix` applies `unreachable_pub` (`pub` -> `pub(crate)`), judged
#      with the `internals` feature on: what atou's own tests and fuzz
#      targets reach through `atou::internals` stays `pub`;
#   3. `cargo fmt`.
# Run from the repository root on a tree whose lib and tests build.
set -eu
cd "$(git rev-parse --show-toplevel)"

find src/cli -name '*.rs' -exec sed -i -E 's/\batou::/crate::/g' {} +

# --broken-code: keep fixes even if an intermediate pass leaves a warning
# of another kind; each pass narrows what the next one sees, so repeat to a
# fixed point.
for _ in 1 2 3 4 5; do
    before=$(git diff --stat | tail -n 1)
    cargo fix --lib --features internals --allow-dirty --allow-staged --broken-code -q
    after=$(git diff --stat | tail -n 1)
    [ "$before" = "$after" ] && break
done

cargo fmt
