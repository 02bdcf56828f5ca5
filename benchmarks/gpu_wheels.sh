#!/usr/bin/env bash
# The packages ckptprof needs that the device machine's image lacks (it holds torch,
# numpy, safetensors, xxhash, tqdm, psutil, matplotlib and requests, and reaches no
# registry), as wheels for its Python (3.12 on x86-64 by default; PYTHON_VERSION to
# change it) at the versions this .venv holds, into .whl/ (ignored), for `run` to carry.
# benchmarks/README.md gives the device command that installs and uses them.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(
    opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions
    opentelemetry-exporter-otlp-proto-http opentelemetry-exporter-otlp-proto-common
    opentelemetry-exporter-otlp-common opentelemetry-exporter-http-transport
    opentelemetry-proto googleapis-common-protos protobuf perfetto
)
rm -rf .whl && mkdir .whl
pins=()
for name in "${PACKAGES[@]}"; do
    pins+=("$name==$(.venv/bin/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")")
done
platforms=()
for n in 2_17 2_24 2_27 2_28 2_31 2_34; do platforms+=(--platform "manylinux_${n}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${PYTHON_VERSION:-3.12}" \
    --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 -d .whl "${pins[@]}"
du -sh .whl
