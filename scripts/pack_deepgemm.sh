#!/usr/bin/env bash
# Packs DeepGEMM's source with the CUTLASS and fmt headers its submodules pin into one archive
# (build-pack/deepgemm-src.txz, ~1.3 MB), for scripts/h200_deepgemm.sh on a GPU machine that
# has no network. Needs git clones of the three repositories (any history that holds the
# commits):
#
#   DEEPGEMM_GIT=... CUTLASS_GIT=... FMT_GIT=... bash scripts/pack_deepgemm.sh [DEEPGEMM_COMMIT]
#
# DEEPGEMM_COMMIT defaults to the one measured in bench/results/deepgemm/ (54e2261); the
# CUTLASS and fmt commits are read from its submodule entries.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${DEEPGEMM_GIT:?a clone of github.com/deepseek-ai/DeepGEMM}"
: "${CUTLASS_GIT:?a clone of github.com/NVIDIA/cutlass}"
: "${FMT_GIT:?a clone of github.com/fmtlib/fmt}"
dg_commit=${1:-54e22612409371d6364144b69086735beb54e98b}

submodule() { git -C "$DEEPGEMM_GIT" ls-tree "$dg_commit" "third-party/$1" | awk '{print $3}'; }
cutlass_commit=$(submodule cutlass)
fmt_commit=$(submodule fmt)
echo "DeepGEMM $dg_commit, CUTLASS $cutlass_commit, fmt $fmt_commit"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
dst=$stage/DeepGEMM
mkdir -p "$dst"
git -C "$DEEPGEMM_GIT" archive "$dg_commit" | tar x -C "$dst"
rm -rf "$dst/third-party/tilelang_ops"
# Only include/ of each submodule: checkout-index reads just the blobs under it (a partial
# clone may lack the others).
for sub in cutlass:$cutlass_commit:$CUTLASS_GIT fmt:$fmt_commit:$FMT_GIT; do
  IFS=: read -r name commit repo <<<"$sub"
  mkdir -p "$dst/third-party/$name"
  GIT_INDEX_FILE=$stage/index.$name git -C "$repo" read-tree "$commit"
  GIT_INDEX_FILE=$stage/index.$name git -C "$repo" --work-tree="$dst/third-party/$name" checkout-index --prefix="$dst/third-party/$name/" \
    $(git -C "$repo" ls-tree -r --name-only "$commit" include)
  for lic in LICENSE.txt LICENSE LICENSE.rst; do
    git -C "$repo" show "$commit:$lic" >"$dst/third-party/$name/LICENSE" 2>/dev/null && break
  done
done
echo "$dg_commit" >"$dst/COMMIT"
mkdir -p build-pack
tar cJf build-pack/deepgemm-src.txz -C "$stage" DeepGEMM
ls -la build-pack/deepgemm-src.txz
