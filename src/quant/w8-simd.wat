;; The WebAssembly SIMD kernels of w8-simd.ts: W8 and W4 codes and f16 bits straight from bf16
;; checkpoint bits. w8-simd.ts compiles this with wabt when it loads, and explains why the codes equal
;; quantizeRows' codes. Every pointer is a byte offset into the imported memory. Loads and stores
;; say align=1 because rows start at any multiple of 16 bytes (alignment is only a hint anyway).
;; Locals are not initialised in code: wasm zeroes them ($acc, $zero).
(module
  (import "e" "m" (memory 0))

  ;; max(p, n) → the largest (bits & 0x7fff) of the n bf16 at p (n a multiple of 8, at least 8).
  ;; Finite floats order by magnitude like these bits, so this gives max|w| without converting.
  ;; inf and NaN come out ≥ 0x7f80, and the caller sends those rows to quantizeRows.
  (func $max (export "max") (param $p i32) (param $n i32) (result i32)
    (local $end i32) (local $acc v128) (local $mask v128)
    (local.set $end (i32.add (local.get $p) (i32.shl (local.get $n) (i32.const 1))))
    (local.set $mask (v128.const i16x8 0x7fff 0x7fff 0x7fff 0x7fff 0x7fff 0x7fff 0x7fff 0x7fff))
    (loop $next
      (local.set $acc (i16x8.max_u (local.get $acc) (v128.and (v128.load align=1 (local.get $p)) (local.get $mask))))
      (br_if $next (i32.lt_u (local.tee $p (i32.add (local.get $p) (i32.const 16))) (local.get $end))))
    ;; Fold the 8 lanes into lane 0: max with the other half, then the other quarter, then the neighbour.
    (local.set $acc (i16x8.max_u (local.get $acc)
      (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $acc) (local.get $acc))))
    (local.set $acc (i16x8.max_u (local.get $acc)
      (i8x16.shuffle 4 5 6 7 0 1 2 3 8 9 10 11 12 13 14 15 (local.get $acc) (local.get $acc))))
    (i16x8.extract_lane_u 0 (i16x8.max_u (local.get $acc)
      (i8x16.shuffle 2 3 0 1 4 5 6 7 8 9 10 11 12 13 14 15 (local.get $acc) (local.get $acc)))))

  ;; q(p, n, d, inv, zp): the n bf16 at p (n a multiple of 16) → n bytes at d, each
  ;; clamp(round-half-even(w · inv), −127, 127) + zp (mod 256).
  ;; A bf16 is the top half of an f32, so shuffling it into the top half of a zeroed f32 lane
  ;; converts it exactly. The product is taken in f64 because the argument in w8-simd.ts needs it
  ;; within 2^-45 of w/s (f32 would give only 2^-24 or so). Adding 1.5·2^52 rounds it half to even,
  ;; to an integer held in the low 32 bits of the f64, and shuffles pick those out as i32 lanes.
  ;; The saturating narrows and the max with −127 then clamp to ±127.
  (func $q (export "q") (param $p i32) (param $n i32) (param $d i32) (param $inv f64) (param $zp i32)
    (local $end i32)
    (local $invs v128) (local $round v128) (local $zps v128) (local $minus127 v128)
    (local $x0 v128) (local $x1 v128) (local $zero v128)
    (local.set $end (i32.add (local.get $p) (i32.shl (local.get $n) (i32.const 1))))
    (local.set $invs (f64x2.splat (local.get $inv)))
    (local.set $round (v128.const f64x2 0x1.8p+52 0x1.8p+52))
    (local.set $zps (i8x16.splat (local.get $zp)))
    (local.set $minus127 (v128.const i8x16 -127 -127 -127 -127 -127 -127 -127 -127 -127 -127 -127 -127 -127 -127 -127 -127))
    (loop $next
      ;; 16 bf16 per round: elements 0-7 in $x0, 8-15 in $x1.
      (local.set $x0 (v128.load align=1 (local.get $p)))
      (local.set $x1 (v128.load offset=16 align=1 (local.get $p)))
      local.get $d
      ;; Each two-line group: elements 2k, 2k+1 → f32 lanes 0, 1 → f64x2, · inv, + 1.5·2^52.
      ;; Each "0 1 2 3 8 9 …" shuffle: the low 32 bits of two such f64x2 → four i32 codes.
      local.get $x0 local.get $zero i8x16.shuffle 16 16  0  1 16 16  2  3 16 16 16 16 16 16 16 16
      f64x2.promote_low_f32x4 local.get $invs f64x2.mul local.get $round f64x2.add
      local.get $x0 local.get $zero i8x16.shuffle 16 16  4  5 16 16  6  7 16 16 16 16 16 16 16 16
      f64x2.promote_low_f32x4 local.get $invs f64x2.mul local.get $round f64x2.add
      i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27
      local.get $x0 local.get $zero i8x16.shuffle 16 16  8  9 16 16 10 11 16 16 16 16 16 16 16 16
      f64x2.promote_low_f32x4 local.get $invs f64x2.mul local.get $round f64x2.add
      local.get $x0 local.get $zero i8x16.shuffle 16 16 12 13 16 16 14 15 16 16 16 16 16 16 16 16
      f64x2.promote_low_f32x4 local.get $invs f64x2.mul local.get $round f64x2.add
      i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27
      i16x8.narrow_i32x4_s
      local.get $x1 local.get $zero i8x16.shuffle 16 16  0  1 16 16  2  3 16 16 16 16 16 16 16 16
      f64x2.promote_low_f32x4 local.get $invs f64x2.mul local.get $round f64x2.add
      local.get $x1 local.get $zero i8x16.shuffle 16 16  4  5 16 16  6  7 16 16 16 16 16 16 16 16
      f64x2.promote_low_f32x4 local.get $invs f64x2.mul local.get $round f64x2.add
      i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27
      local.get $x1 local.get $zero i8x16.shuffle 16 16  8  9 16 16 10 11 16 16 16 16 16 16 16 16
      f64x2.promote_low_f32x4 local.get $invs f64x2.mul local.get $round f64x2.add
      local.get $x1 local.get $zero i8x16.shuffle 16 16 12 13 16 16 14 15 16 16 16 16 16 16 16 16
      f64x2.promote_low_f32x4 local.get $invs f64x2.mul local.get $round f64x2.add
      i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27
      i16x8.narrow_i32x4_s
      ;; 16 i16 codes → saturated to i8, clamped to ≥ −127, offset by the zero point, stored at d.
      i8x16.narrow_i16x8_s
      local.get $minus127 i8x16.max_s
      local.get $zps i8x16.add
      v128.store align=1
      (local.set $p (i32.add (local.get $p) (i32.const 32)))
      (local.set $d (i32.add (local.get $d) (i32.const 16)))
      (br_if $next (i32.lt_u (local.get $p) (local.get $end)))))

  ;; w4(p, n, d, s) → the largest (bits & 0x7fff) of the n bf16 at p (n a multiple of 32): callers
  ;; redo the call with quantizeW4Rows when it is ≥ 0x7f80 (inf or NaN somewhere). Per block of 32:
  ;; its scale fround(max|w| / 7) (1 for an all-zero block) as an f32 at s, and its 32 codes
  ;; round-half-even(w / scale) + 8, two a byte, low nibble first, as 16 bytes at d.
  ;; The max is found on the bits as in $max. Each code is quantizeW4Rows' own arithmetic: f64(w) /
  ;; f64(scale), then + (1.5·2^52 + 8), which rounds half to even and adds the code offset in one
  ;; step (8 is even, so ties go the same way), leaving the code in the low bits of the f64. No clamp:
  ;; |w| ≤ max makes |w / scale| < 7.5. (Exact variants multiplying by 1/scale as $q does, with a
  ;; branch or a snap for the blocks where w / scale can be a tie, measured at most ~13% faster.)
  ;; Codes of 8 elements: shuffles pick the low 32 bits of two f64x2 as four i32, narrowed to i16
  ;; lanes c0..c7; as i32 lanes (c2k | c2k+1 << 16), lane | lane >> 12 has c2k | c2k+1 << 4 in its
  ;; low byte, and a shuffle gathers those 4 bytes.
  (func $w4 (export "w4") (param $p i32) (param $n i32) (param $d i32) (param $s i32) (result i32)
    (local $end i32) (local $all i32) (local $m i32) (local $k i32) (local $scale f32)
    (local $acc v128) (local $mask v128) (local $f v128) (local $round v128) (local $x v128) (local $c v128) (local $zero v128)
    (local.set $end (i32.add (local.get $p) (i32.shl (local.get $n) (i32.const 1))))
    (local.set $mask (v128.const i16x8 0x7fff 0x7fff 0x7fff 0x7fff 0x7fff 0x7fff 0x7fff 0x7fff))
    (local.set $round (v128.const f64x2 0x1.8000000000008p+52 0x1.8000000000008p+52))
    (loop $block
      (local.set $acc (i16x8.max_u
        (i16x8.max_u
          (v128.and (v128.load align=1 (local.get $p)) (local.get $mask))
          (v128.and (v128.load offset=16 align=1 (local.get $p)) (local.get $mask)))
        (i16x8.max_u
          (v128.and (v128.load offset=32 align=1 (local.get $p)) (local.get $mask))
          (v128.and (v128.load offset=48 align=1 (local.get $p)) (local.get $mask)))))
      (local.set $acc (i16x8.max_u (local.get $acc)
        (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $acc) (local.get $acc))))
      (local.set $acc (i16x8.max_u (local.get $acc)
        (i8x16.shuffle 4 5 6 7 0 1 2 3 8 9 10 11 12 13 14 15 (local.get $acc) (local.get $acc))))
      (local.set $m (i16x8.extract_lane_u 0 (i16x8.max_u (local.get $acc)
        (i8x16.shuffle 2 3 0 1 4 5 6 7 8 9 10 11 12 13 14 15 (local.get $acc) (local.get $acc)))))
      (if (i32.gt_u (local.get $m) (local.get $all)) (then (local.set $all (local.get $m))))
      (local.set $scale (f32.const 1))
      (if (local.get $m) (then
        (local.set $scale (f32.demote_f64 (f64.div
          (f64.promote_f32 (f32.reinterpret_i32 (i32.shl (local.get $m) (i32.const 16))))
          (f64.const 7))))))
      (f32.store align=1 (local.get $s) (local.get $scale))
      (local.set $f (f64x2.splat (f64.promote_f32 (local.get $scale))))
      ;; The block's 4 vectors of 8 bf16 → 4 bytes each.
      (local.set $k (i32.const 4))
      (loop $eight
        (local.set $x (v128.load align=1 (local.get $p)))
        (local.set $c
          (i16x8.narrow_i32x4_s
            (i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27
              (f64x2.add (f64x2.div (f64x2.promote_low_f32x4 (i8x16.shuffle 16 16  0  1 16 16  2  3 16 16 16 16 16 16 16 16 (local.get $x) (local.get $zero))) (local.get $f)) (local.get $round))
              (f64x2.add (f64x2.div (f64x2.promote_low_f32x4 (i8x16.shuffle 16 16  4  5 16 16  6  7 16 16 16 16 16 16 16 16 (local.get $x) (local.get $zero))) (local.get $f)) (local.get $round)))
            (i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27
              (f64x2.add (f64x2.div (f64x2.promote_low_f32x4 (i8x16.shuffle 16 16  8  9 16 16 10 11 16 16 16 16 16 16 16 16 (local.get $x) (local.get $zero))) (local.get $f)) (local.get $round))
              (f64x2.add (f64x2.div (f64x2.promote_low_f32x4 (i8x16.shuffle 16 16 12 13 16 16 14 15 16 16 16 16 16 16 16 16 (local.get $x) (local.get $zero))) (local.get $f)) (local.get $round)))))
        (local.set $c (v128.or (local.get $c) (i32x4.shr_u (local.get $c) (i32.const 12))))
        (i32.store align=1 (local.get $d) (i32x4.extract_lane 0
          (i8x16.shuffle 0 4 8 12 0 0 0 0 0 0 0 0 0 0 0 0 (local.get $c) (local.get $c))))
        (local.set $p (i32.add (local.get $p) (i32.const 16)))
        (local.set $d (i32.add (local.get $d) (i32.const 4)))
        (br_if $eight (local.tee $k (i32.sub (local.get $k) (i32.const 1)))))
      (local.set $s (i32.add (local.get $s) (i32.const 4)))
      (br_if $block (i32.lt_u (local.get $p) (local.get $end))))
    (local.get $all))

  ;; f16(p, n, d): the n bf16 at p (n a multiple of 8) → their f16 bit patterns at d, rounded as
  ;; f32BitsToF16Bits rounds them. Works on magnitudes $a and puts the sign back at the end.
  ;; Three ranges:
  ;; - f16-normal magnitudes are exact in f16, so the bits are just rebiased: (a − 0x3800) << 3.
  ;; - From 65536 up it is inf or NaN (no bf16 lies between 65504 and 65536). NaN keeps the top
  ;;   payload bits.
  ;; - Below the f16 normals (rare, so behind a branch) the f16 bits are
  ;;   round-half-even(|x| · 2^24), computed in f32 (scaling by 2^24 is exact).
  (func $f16 (export "f16") (param $p i32) (param $n i32) (param $d i32)
    (local $end i32) (local $a v128) (local $r v128) (local $small v128) (local $x v128)
    (local.set $end (i32.add (local.get $p) (i32.shl (local.get $n) (i32.const 1))))
    (loop $next
      (local.set $a (v128.and
        (local.tee $x (v128.load align=1 (local.get $p)))
        (v128.const i16x8 0x7fff 0x7fff 0x7fff 0x7fff 0x7fff 0x7fff 0x7fff 0x7fff)))
      (local.set $r (i16x8.shl
        (i16x8.sub (local.get $a) (v128.const i16x8 0x3800 0x3800 0x3800 0x3800 0x3800 0x3800 0x3800 0x3800))
        (i32.const 3)))
      ;; Above 0x477f (65504 and up): inf, or for NaN (above 0x7f80) 0x7e00 | the payload's top bits.
      (local.set $r (v128.bitselect
        (v128.bitselect
          (v128.or
            (v128.const i16x8 0x7e00 0x7e00 0x7e00 0x7e00 0x7e00 0x7e00 0x7e00 0x7e00)
            (v128.and
              (i16x8.shl (local.get $a) (i32.const 3))
              (v128.const i16x8 0x03ff 0x03ff 0x03ff 0x03ff 0x03ff 0x03ff 0x03ff 0x03ff)))
          (v128.const i16x8 0x7c00 0x7c00 0x7c00 0x7c00 0x7c00 0x7c00 0x7c00 0x7c00)
          (i16x8.gt_s (local.get $a) (v128.const i16x8 0x7f80 0x7f80 0x7f80 0x7f80 0x7f80 0x7f80 0x7f80 0x7f80)))
        (local.get $r)
        (i16x8.gt_s (local.get $a) (v128.const i16x8 0x477f 0x477f 0x477f 0x477f 0x477f 0x477f 0x477f 0x477f))))
      ;; Below 0x3880 (2^-14, the least f16 normal): widen to f32 (bf16 << 16), · 2^24, round.
      (if (v128.any_true
            (local.tee $small (i16x8.lt_s (local.get $a) (v128.const i16x8 0x3880 0x3880 0x3880 0x3880 0x3880 0x3880 0x3880 0x3880))))
        (then
          (local.set $r (v128.bitselect
            (i16x8.narrow_i32x4_s
              (i32x4.trunc_sat_f32x4_s (f32x4.nearest (f32x4.mul
                (i32x4.shl (i32x4.extend_low_i16x8_u (local.get $a)) (i32.const 16))
                (v128.const f32x4 0x1p24 0x1p24 0x1p24 0x1p24))))
              (i32x4.trunc_sat_f32x4_s (f32x4.nearest (f32x4.mul
                (i32x4.shl (i32x4.extend_high_i16x8_u (local.get $a)) (i32.const 16))
                (v128.const f32x4 0x1p24 0x1p24 0x1p24 0x1p24)))))
            (local.get $r)
            (local.get $small)))))
      (v128.store align=1 (local.get $d)
        (v128.or (local.get $r) (v128.and (local.get $x) (v128.const i16x8 0x8000 0x8000 0x8000 0x8000 0x8000 0x8000 0x8000 0x8000))))
      (local.set $d (i32.add (local.get $d) (i32.const 16)))
      (br_if $next (i32.lt_u (local.tee $p (i32.add (local.get $p) (i32.const 16))) (local.get $end))))))
