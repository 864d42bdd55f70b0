#!/usr/bin/env bash
# Fetches what the native runtime builds against, idempotently, and prints the paths as KEY=VALUE:
#   ORT_VERSION, ORT_LIB (the Linux x86_64 libonnxruntime.so.1), ORT_INCLUDE_DIR, ORT_HEADERS_API,
#   ORT_HEADERS_SOURCE.
# Nothing fetched here is committed: it is cached under ${FORGE_HOME:-$HOME/.cache/forge}/native-deps/
# keyed by version, each entry with a .complete marker written last (a killed run leaves no half entry).
#
# ORT library: the CPU binary shipped inside the npm package onnxruntime-node (already installed).
# ORT headers: the Maven Central AAR com.microsoft.onnxruntime:onnxruntime-android:<version> has
# headers/; when that artifact cannot be had (some Maven Central mirrors do not carry it), Debian's
# libonnxruntime-dev (unstable) is the fallback: headers only, never installed, just unpacked.
# Headers older than the library are fine (the C API table is append-only); newer are refused.
#
# Build tools and libraries (cmake, ninja, g++, GoogleTest, nlohmann/json; for image input
# libjpeg-turbo, libpng and stb_image_resize; for audio input libsndfile, libsoxr and KissFFT) are
# installed with apt on Debian when missing, and the script says so; elsewhere it names what is
# missing and stops.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
deps="${FORGE_HOME:-$HOME/.cache/forge}/native-deps"
mkdir -p "$deps"
log() { echo "deps.sh: $*" >&2; }

# --- build tools -------------------------------------------------------------------------------
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v g++ >/dev/null || missing+=(g++)
[ -f /usr/include/gtest/gtest.h ] && { [ -f /usr/lib/x86_64-linux-gnu/libgtest.a ] || [ -f /usr/lib/libgtest.a ] || ls /usr/lib/*/libgtest.a >/dev/null 2>&1; } || missing+=(libgtest-dev)
[ -f /usr/include/nlohmann/json.hpp ] || missing+=(nlohmann-json3-dev)
# Image input (src/image_input.cpp): JPEG and PNG decoders, and the resampler (a header).
[ -f /usr/include/jpeglib.h ] || missing+=(libjpeg62-turbo-dev)
[ -f /usr/include/png.h ] || missing+=(libpng-dev)
[ -f /usr/include/stb/stb_image_resize.h ] || missing+=(libstb-dev)
# Audio input (src/audio_input.cpp): the decoder, the resampler, the FFT (a header).
[ -f /usr/include/sndfile.h ] || missing+=(libsndfile1-dev)
[ -f /usr/include/soxr.h ] || missing+=(libsoxr-dev)
[ -f /usr/include/kissfft/kissfft.hh ] || missing+=(libkissfft-dev)
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null && [ -f /etc/debian_version ]; then
    log "installing missing build dependencies with apt: ${missing[*]}"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
  else
    log "missing build dependencies: ${missing[*]} (install them; only Debian is automated)"
    exit 1
  fi
fi

# --- ORT library from onnxruntime-node ---------------------------------------------------------
pkg="$repo/node_modules/onnxruntime-node"
[ -f "$pkg/package.json" ] || { log "onnxruntime-node is not installed in $repo/node_modules (run npm ci)"; exit 1; }
ort_version="$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$pkg/package.json" | head -1)"
src_lib="$(ls "$pkg"/bin/napi-v*/linux/x64/libonnxruntime.so.1 2>/dev/null | head -1 || true)"
[ -n "$src_lib" ] || { log "onnxruntime-node $ort_version ships no linux/x64 libonnxruntime.so.1"; exit 1; }
libdir="$deps/onnxruntime-$ort_version-linux-x64"
if [ ! -f "$libdir/.complete" ]; then
  log "copying libonnxruntime.so.1 from onnxruntime-node $ort_version"
  rm -rf "$libdir.tmp" && mkdir -p "$libdir.tmp/lib"
  cp "$src_lib" "$libdir.tmp/lib/libonnxruntime.so.1"
  ln -s libonnxruntime.so.1 "$libdir.tmp/lib/libonnxruntime.so"
  touch "$libdir.tmp/.complete" && rm -rf "$libdir" && mv "$libdir.tmp" "$libdir"
fi
lib_minor="$(echo "$ort_version" | cut -d. -f2)"

# --- ORT headers -------------------------------------------------------------------------------
api_of() { sed -n 's/^#define ORT_API_VERSION \([0-9]*\).*/\1/p' "$1/onnxruntime_c_api.h"; }

from_maven() { # $1 = version, $2 = destination; the AAR is a zip with headers/
  local v="$1" dst="$2" url="https://repo.maven.apache.org/maven2/com/microsoft/onnxruntime/onnxruntime-android/$1/onnxruntime-android-$1.aar"
  local tmp; tmp="$(mktemp -d)"
  if curl -fsSL --retry 2 -o "$tmp/ort.aar" "$url" 2>/dev/null; then
    mkdir -p "$dst/include" && (cd "$tmp" && unzip -q ort.aar 'headers/*') && cp "$tmp"/headers/*.h "$dst/include/"
    rm -rf "$tmp"; return 0
  fi
  rm -rf "$tmp"; return 1
}

from_debian() { # $1 = destination; unpacks libonnxruntime-dev from Debian unstable with a private apt state
  local dst="$1" a; a="$(mktemp -d)"
  mkdir -p "$a/lists/partial" "$a/cache/archives/partial" "$a/etc"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main" >"$a/etc/sources.list"
  local o=(-o "Dir::Etc::SourceList=$a/etc/sources.list" -o Dir::Etc::SourceParts=/nonexistent -o "Dir::State::Lists=$a/lists"
    -o "Dir::Cache=$a/cache" -o Dir::State::status=/dev/null -o APT::Architecture=amd64 -o APT::Sandbox::User=root)
  apt-get "${o[@]}" update -qq >&2 || { rm -rf "$a"; return 1; }
  (cd "$a" && apt-get "${o[@]}" download -qq libonnxruntime-dev >&2) || { rm -rf "$a"; return 1; }
  mkdir -p "$a/x" && dpkg-deb -x "$a"/libonnxruntime-dev_*.deb "$a/x"
  mkdir -p "$dst/include" && cp "$a"/x/usr/include/onnxruntime/*.h "$dst/include/"
  basename "$a"/libonnxruntime-dev_*.deb >"$dst/debian-package"
  rm -rf "$a"
}

# Reuse any complete header entry no newer than the library, preferring the exact version.
hdr=""
for d in "$deps/onnxruntime-headers-maven-$ort_version" "$deps"/onnxruntime-headers-*; do
  [ -f "$d/.complete" ] || continue
  api="$(api_of "$d/include")"
  if [ -n "$api" ] && [ "$api" -le "$lib_minor" ]; then hdr="$d"; break; fi
done
if [ -z "$hdr" ]; then
  tmp="$deps/onnxruntime-headers.tmp.$$"
  rm -rf "$tmp"
  if from_maven "$ort_version" "$tmp"; then
    name="onnxruntime-headers-maven-$ort_version"
  else
    log "Maven Central has no com.microsoft.onnxruntime:onnxruntime-android:$ort_version here; trying Debian's libonnxruntime-dev"
    rm -rf "$tmp"
    command -v apt-get >/dev/null || { log "no apt-get: cannot fetch ORT headers"; exit 1; }
    from_debian "$tmp" || { log "could not fetch libonnxruntime-dev from Debian"; exit 1; }
    name="onnxruntime-headers-debian-$(sed 's/^libonnxruntime-dev_\([^_]*\)_.*/\1/; s/[^A-Za-z0-9.+-]/_/g' "$tmp/debian-package")"
  fi
  api="$(api_of "$tmp/include")"
  [ -n "$api" ] || { log "fetched headers have no ORT_API_VERSION"; exit 1; }
  if [ "$api" -gt "$lib_minor" ]; then log "headers are API $api, newer than the $ort_version library"; exit 1; fi
  touch "$tmp/.complete"
  rm -rf "${deps:?}/$name" && mv "$tmp" "$deps/$name"
  hdr="$deps/$name"
  log "ORT headers (API $api) cached in $hdr"
fi

echo "ORT_VERSION=$ort_version"
echo "ORT_LIB=$libdir/lib/libonnxruntime.so.1"
echo "ORT_INCLUDE_DIR=$hdr/include"
echo "ORT_HEADERS_API=$(api_of "$hdr/include")"
echo "ORT_HEADERS_SOURCE=$(basename "$hdr")"
