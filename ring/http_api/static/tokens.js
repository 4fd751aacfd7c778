// Token arithmetic of the ring, as ring.hashing does it: Murmur3 x64-128's
// first 64 bits (seed 0) and partition tokens, in BigInt so that every bit
// matches the brokers'; and the angle at which a token is drawn.

const TWO_63 = 2n ** 63n;
const TWO_64 = 2n ** 64n;
const MASK_64 = TWO_64 - 1n;

const rotl = (x, r) => ((x << r) | (x >> (64n - r))) & MASK_64;

function fmix64(k) {
  k ^= k >> 33n; k = (k * 0xff51afd7ed558ccdn) & MASK_64;
  k ^= k >> 33n; k = (k * 0xc4ceb9fe1a85ec53n) & MASK_64;
  return k ^ (k >> 33n);
}

// First 64 bits of Murmur3 x64-128, seed 0, unsigned: ring.hashing.token's bits.
export function murmur3First64(bytes) {
  const c1 = 0x87c37b91114253d5n, c2 = 0x4cf5ad432745937fn;
  const n = bytes.length, blocks = Math.floor(n / 16);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let h1 = 0n, h2 = 0n;
  for (let i = 0; i < blocks; i++) {
    let k1 = view.getBigUint64(i * 16, true), k2 = view.getBigUint64(i * 16 + 8, true);
    k1 = (rotl((k1 * c1) & MASK_64, 31n) * c2) & MASK_64; h1 ^= k1;
    h1 = (((rotl(h1, 27n) + h2) & MASK_64) * 5n + 0x52dce729n) & MASK_64;
    k2 = (rotl((k2 * c2) & MASK_64, 33n) * c1) & MASK_64; h2 ^= k2;
    h2 = (((rotl(h2, 31n) + h1) & MASK_64) * 5n + 0x38495ab5n) & MASK_64;
  }
  const tail = blocks * 16, rem = n & 15;
  let k1 = 0n, k2 = 0n;
  for (let i = rem - 1; i >= 8; i--) k2 ^= BigInt(bytes[tail + i]) << BigInt((i - 8) * 8);
  if (rem > 8) { k2 = (rotl((k2 * c2) & MASK_64, 33n) * c1) & MASK_64; h2 ^= k2; }
  for (let i = Math.min(rem, 8) - 1; i >= 0; i--) k1 ^= BigInt(bytes[tail + i]) << BigInt(i * 8);
  if (rem > 0) { k1 = (rotl((k1 * c1) & MASK_64, 31n) * c2) & MASK_64; h1 ^= k1; }
  h1 ^= BigInt(n); h2 ^= BigInt(n);
  h1 = (h1 + h2) & MASK_64; h2 = (h2 + h1) & MASK_64;
  h1 = fmix64(h1); h2 = fmix64(h2);
  return (h1 + h2) & MASK_64;
}

const toSigned = (u) => (u >= TWO_63 ? u - TWO_64 : u);

function bitReverse(value, width) {
  let out = 0n;
  for (let i = 0n; i < width; i++) { out = (out << 1n) | (value & 1n); value >>= 1n; }
  return out;
}

// ring.hashing.tokens.position: [numerator, denominator] of the index-th point when `base`
// points start evenly spaced and each later level splits every range of the one before.
function position(index, base) {
  if (index < base) return [index, base];
  const level = BigInt((index / base).toString(2).length);
  const before = base << (level - 1n);
  const offset = index - before;
  const split = (offset % base) * (1n << (level - 1n)) + bitReverse(offset / base, level - 1n);
  return [2n * split + 1n, base << level];
}

// ring.hashing.partition_token: murmur3(topic) + position(p, B) * 2^64, as a signed token,
// where B is the partition count the topic was created with (base_partitions).
export function partitionToken(topic, partition, partitions, base = partitions) {
  const start = murmur3First64(new TextEncoder().encode(topic));
  const [num, den] = position(BigInt(partition), BigInt(base || partitions));
  return toSigned((start + (num * TWO_64) / den) & MASK_64);
}

export function toBig(token) {
  if (typeof token === "bigint") return token;
  if (typeof token === "number" && Number.isFinite(token)) return BigInt(Math.round(token));
  if (typeof token === "string" && /^-?\d+$/.test(token)) return BigInt(token);
  return null;
}

// Token -> angle in radians, clockwise from the top, where the smallest token sits.
export function angleOf(token) {
  const t = toBig(token);
  if (t === null) return 0;
  return (Number(t + TWO_63) / Number(TWO_64)) * 2 * Math.PI;
}
