#!/usr/bin/env bash
# Checks the layering rules of docs/design.md on the source tree; run by
# CTest as lint.layers. Prints each violation and exits 1 if there is any.
#   1. Each layer includes only headers of layers below it (and its own).
#   2. Only src/core/ops.c (and src/core/backends.c, loading and listing)
#      calls through a back end's table.
#   3. src/transfer/ and src/coherence/ call no public mapping_* function of
#      another layer: they use the internal mapping__* twins.
#   4. No back-end identity above the seam: no comparison with a back end's
#      name or a device kind, except where a back end is chosen by name
#      (src/core/backends.c).
#   5. The library allocates through os/os.h (mapping_os_malloc, ...): the
#      fault sweep (tests/internal/fault_sweep.c) fails any allocation.
set -uo pipefail
cd "$(dirname "$0")/.."
bad=0
fail() { echo "layering: $*"; bad=1; }

# 1. includes: layer -> the src/ folders it may include
declare -A may=(
  [os]="os"
  [track]="os track"
  [backend]="os backend"
  [core]="os track backend core"
  [observe]="os backend core observe"
  [transfer]="os track backend core transfer"
  [coherence]="os track backend core transfer coherence"
  [testing]="os track backend core transfer coherence observe testing"
)
for layer in "${!may[@]}"; do
  [ -d "src/$layer" ] || continue
  while IFS= read -r hit; do
    file=${hit%%:*}
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$hit")
    top=${inc%%/*}
    [ "$inc" = "mapping.h" ] && continue
    [ "$top" = "$inc" ] && continue # same-folder include without a path
    case " ${may[$layer]} " in *" $top "*) ;; *) fail "$file includes $inc (layer $layer may include: ${may[$layer]})";; esac
  done < <(grep -rn --include='*.c' --include='*.h' '#include "' "src/$layer" | sed -E 's/^([^:]+):[0-9]+:/\1:/')
done
# A back end includes backend.h, its own folder and os/ only.
for dir in src/backend/*/; do
  name=$(basename "$dir")
  while IFS= read -r hit; do
    file=${hit%%:*}
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$hit")
    case "$inc" in mapping.h|os/*|backend/backend.h|backend/$name/*) ;; */*) fail "$file includes $inc (a back end includes backend/backend.h, backend/$name/ and os/ only)";; esac
  done < <(grep -rn --include='*.c' --include='*.h' '#include "' "$dir" | sed -E 's/^([^:]+):[0-9]+:/\1:/')
done

# The optional libmapping_mpi (src/mpi/) is a user of the public API: it
# includes mapping.h, mapping_mpi.h and its own folder only.
if [ -d src/mpi ]; then
  while IFS= read -r hit; do
    file=${hit%%:*}
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$hit")
    case "$inc" in mapping.h|mapping_mpi.h|mpi/*) ;; *) fail "$file includes $inc (src/mpi/ uses the public API only: mapping.h, mapping_mpi.h, mpi/)";; esac
  done < <(grep -rn --include='*.c' --include='*.h' '#include "' src/mpi | sed -E 's/^([^:]+):[0-9]+:/\1:/')
fi

# 2. calls through the back-end table
while IFS= read -r hit; do
  fail "calls through the back-end table outside src/core/ops.c: $hit"
done < <(grep -rnE '\bbe->[a-z_]+[[:space:]]*\(' src --include='*.c' --include='*.h' |
         grep -vE '^src/core/(ops|backends)\.c:')

# 3. public functions of other layers called from transfer/ and coherence/
for layer in transfer coherence; do
  own=$(grep -hoE '^[a-z].*\bmapping_[a-z][a-z0-9_]*\(' src/$layer/*.c | grep -oE '\bmapping_[a-z][a-z0-9_]*\(' | sort -u)
  while IFS= read -r hit; do
    name=$(grep -oE '\bmapping_[a-z][a-z0-9_]*\(' <<<"${hit#*:*:}" | head -1)
    for call in $(grep -oE '\bmapping_[a-z][a-z0-9_]*\(' <<<"${hit#*:*:}"); do
      case "$call" in mapping_os_*|mapping_track_*) continue;; esac # the os and track layers' functions
      grep -qxF "$call" <<<"$own" || fail "${hit%%:*}: calls ${call%(} (a public function of another layer; call its mapping__ twin)"
    done
  done < <(grep -nE '\bmapping_[a-z][a-z0-9_]*\(' src/$layer/*.c | grep -vE '^[^:]+:[0-9]+:[a-z]')
done

# The prefix mapping_track_ belongs to the track layer: no public function has it.
while IFS= read -r hit; do
  fail "include/mapping.h declares $hit: the prefix mapping_track_ is the track layer's (src/track/)"
done < <(grep -oE '\bmapping_track_[a-z0-9_]+\(' include/mapping.h)

# 5. the library allocates through os/os.h (mapping_os_malloc, ...; src/mpi, a separate
#    library on the public API only, excepted), so the
#    fault sweep's failed allocations reach every allocation
while IFS= read -r hit; do
  fail "allocates without os/os.h (use mapping_os_malloc, _calloc, _realloc, _aligned_alloc): $hit"
done < <(grep -rnE '(^|[^_a-z])(malloc|calloc|realloc|aligned_alloc|strdup)[[:space:]]*\(' src --include='*.c' |
         grep -vE '^src/(os/memory\.c|mpi/)' | grep -vE '^[^:]+:[0-9]+:[[:space:]]*(/?\*|//)')

# 4. back-end names and device kinds above the seam
while IFS= read -r hit; do
  fail "compares a back-end name or device kind above the seam (use a capability or the link): $hit"
done < <(grep -rnE '(strn?cmp|==)[^;]*"(host|opencl|cuda|cpu|gpu|accelerator)"' src/core src/transfer src/coherence src/observe \
           --include='*.c' --include='*.h' | grep -vE '^src/core/backends\.c:')

if [ $bad -eq 0 ]; then echo "layering: ok (includes, the back-end seam, internal calls, no back-end names above the seam, allocations through os/)"; fi
exit $bad
