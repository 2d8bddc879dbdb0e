// Fuzz target: HDF5 token files (pipetrain/io/token_dataset.hpp): inspect_token_file,
// TokenDataset (open, read_window, read_tokens) and a sequential BatchSampler on top.
// Structure-aware: the input drives a generator that writes a well-formed HDF5 file
// through the HDF5 C API (never raw bytes: HDF5's own parser is not under test), shaped
// like what `pipetrain data` writes (1-D /tokens of uint16/uint32, attributes vocab_size
// and tokenizer on the root group), with the object, its type, shape, layout, filters,
// values and attributes varied. The readers must succeed or throw pipetrain::Error;
// anything else is a finding, and so is an HDF5 object left open.
//
// Input layout (every byte read past the end is 0 = what TokenFileWriter writes, so the
// empty input is a valid token file of 257 tokens < 256 with vocab_size 256):
//   flags     1 libver latest, 2 attributes on /tokens instead of the root, 4 on both
//             (root ones say vocab_size 300), 8 512-byte user block, 16 unrelated
//             objects, 32 not an HDF5 file at all (text, no signature), 64 no file
//   object    % 8: 0 dataset /tokens, 1 none (a dataset "Tokens"), 2 a group, 3 a named
//             datatype, 4 soft link to /data/tok, 5 dangling soft link, 6 external link
//             to a missing file, 7 dataset /data/tok hard-linked as /tokens too
//   dtype     % 16: 0 u16le 1 u32le 2 u16be 3 u32be 4 u8 5 u64 6 i16 7 i32 8 i64 9 f32
//             10 f64be 11 string 12 enum 13 u16 with 12-bit precision 14 u32 with
//             precision 20 offset 4 15 bitfield
//   shape     % 8: 0 1-D, 1 scalar, 2 null, 3 2-D, 4 3-D, 5 1-D extendible, 6 1-D declared
//             longer than written (+4 bytes), 7 1-D huge and sparse (+1 byte)
//   count     2 bytes: 0 -> 257 tokens, v -> (v-1) % 4097
//   layout    % 8: 0 contiguous, 1 chunked, 2 +deflate, 3 +shuffle+deflate, 4 +Fletcher32,
//             5 compact, 6 fill value 7 + early allocation, 7 chunks of 1; then 2 bytes
//             chunk length (0 -> 64)
//   values    % 4: 0 i % 256, 1 raw bytes from the input (+1 length byte, the bytes
//             repeat), 2 all bits set, 3 like 0 with token 256 at one index (+2 bytes)
//   vocab_size form % 12 (0/8-11 int64 scalar, 1 absent, 2 other numeric type (+1),
//             3 fixed string, 4 vlen string, 5 null space, 6 1-D of 0..8 (+1),
//             7 odd type (+1)); value % 8 (0 256, 1 0, 2 -1, 3 65536, 4 2^31,
//             5 INT64_MAX, 6 1, 7 8 raw bytes)
//   tokenizer form % 12 (0/11 vlen UTF-8 scalar, 1 absent, 2-4 fixed NULLTERM/NULLPAD/
//             SPACEPAD, 5 int, 6 1-D of 0..3 vlen (+1), 7 null space, 8 vlen ASCII,
//             9 odd type (+1), 10 2x2 fixed); value % 4 (0 "byte", 1 "", 2 up to 255
//             bytes from the input (+1 length), 3 "gpt2")
//   reader    2 bytes seq_len (0 -> 16, v -> (v-1) % 5000); 1 byte model vocab (% 8:
//             256, 1, 65536, INT_MAX, 0, -5, 255, 4 raw bytes); 1 byte file count
//             (% 3 + 1: the same file listed 1-3 times)
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/io/batch_sampler.hpp"
#include "pipetrain/io/token_dataset.hpp"

namespace {

using namespace pipetrain_fuzz;

struct Plan {
  uint8_t flags = 0, object = 0, dtype = 0, shape = 0, layout = 0, values = 0;
  uint32_t extra = 0;     // shape 6: declared - written
  uint8_t huge = 0;       // shape 7
  size_t count = 257;     // tokens written
  hsize_t chunk = 64;
  size_t bad_at = 0;      // values 3
  std::string raw;        // values 1
  int vocab_form = 0;
  uint8_t vocab_arg = 0;
  int64_t vocab = 256;
  int tok_form = 0;
  uint8_t tok_arg = 0;
  std::string tokenizer = "byte";
  int seq_len = 16;
  int model_vocab = 256;
  int nfiles = 1;
};

Plan read_plan(Bytes& in) {
  Plan p;
  p.flags = in.u8();
  p.object = in.u8() % 8;
  p.dtype = in.u8() % 16;
  p.shape = in.u8() % 8;
  if (p.shape == 6) p.extra = in.u32() % (1u << 20);
  if (p.shape == 7) p.huge = in.u8();
  const uint16_t c = in.u16();
  p.count = c == 0 ? 257 : (c - 1u) % 4097u;
  p.layout = in.u8() % 8;
  const uint16_t ch = in.u16();
  p.chunk = ch == 0 ? 64 : ch % 4096 + 1;
  p.values = in.u8() % 4;
  if (p.values == 3) p.bad_at = p.count ? in.u16() % p.count : 0;
  if (p.values == 1) p.raw = in.str(in.u8());
  p.vocab_form = in.u8() % 12;
  if (p.vocab_form >= 8) p.vocab_form = 0;
  if (p.vocab_form == 2 || p.vocab_form == 6 || p.vocab_form == 7) p.vocab_arg = in.u8();
  switch (in.u8() % 8) {
    case 1: p.vocab = 0; break;
    case 2: p.vocab = -1; break;
    case 3: p.vocab = 65536; break;
    case 4: p.vocab = int64_t{1} << 31; break;
    case 5: p.vocab = std::numeric_limits<int64_t>::max(); break;
    case 6: p.vocab = 1; break;
    case 7: p.vocab = static_cast<int64_t>(in.u64()); break;
    default: p.vocab = 256;
  }
  p.tok_form = in.u8() % 12;
  if (p.tok_form == 11) p.tok_form = 0;
  if (p.tok_form == 6 || p.tok_form == 9) p.tok_arg = in.u8();
  switch (in.u8() % 4) {
    case 1: p.tokenizer = ""; break;
    case 2: p.tokenizer = in.str(in.u8()); break;
    case 3: p.tokenizer = "gpt2"; break;
    default: p.tokenizer = "byte";
  }
  const uint16_t sl = in.u16();
  p.seq_len = sl == 0 ? 16 : (sl - 1) % 5000;
  switch (in.u8() % 8) {
    case 1: p.model_vocab = 1; break;
    case 2: p.model_vocab = 65536; break;
    case 3: p.model_vocab = std::numeric_limits<int>::max(); break;
    case 4: p.model_vocab = 0; break;
    case 5: p.model_vocab = -5; break;
    case 6: p.model_vocab = 255; break;
    case 7: p.model_vocab = static_cast<int>(in.u32()); break;
    default: p.model_vocab = 256;
  }
  p.nfiles = in.u8() % 3 + 1;
  return p;
}

H token_type(uint8_t k) {
  switch (k) {
    case 0: return H(ok(H5Tcopy(H5T_STD_U16LE)));
    case 1: return H(ok(H5Tcopy(H5T_STD_U32LE)));
    case 2: return H(ok(H5Tcopy(H5T_STD_U16BE)));
    case 3: return H(ok(H5Tcopy(H5T_STD_U32BE)));
    case 4: return H(ok(H5Tcopy(H5T_STD_U8LE)));
    case 5: return H(ok(H5Tcopy(H5T_STD_U64LE)));
    case 6: return H(ok(H5Tcopy(H5T_STD_I16LE)));
    case 7: return H(ok(H5Tcopy(H5T_STD_I32LE)));
    case 8: return H(ok(H5Tcopy(H5T_STD_I64LE)));
    case 9: return H(ok(H5Tcopy(H5T_IEEE_F32LE)));
    case 10: return H(ok(H5Tcopy(H5T_IEEE_F64BE)));
    case 11: return fixed_string_type(4, 0);
    case 12: {
      H t(ok(H5Tenum_create(H5T_STD_U16LE)));
      for (unsigned short v = 0; v < 4; ++v)
        ok_rc(H5Tenum_insert(t.get(), ("t" + std::to_string(v)).c_str(), &v));
      return t;
    }
    case 13: {
      H t(ok(H5Tcopy(H5T_STD_U16LE)));
      ok_rc(H5Tset_precision(t.get(), 12));
      return t;
    }
    case 14: {
      H t(ok(H5Tcopy(H5T_STD_U32LE)));
      ok_rc(H5Tset_precision(t.get(), 20));
      ok_rc(H5Tset_offset(t.get(), 4));
      return t;
    }
    default: return H(ok(H5Tcopy(H5T_STD_B16LE)));
  }
}

bool numeric(uint8_t dtype) { return dtype <= 10 || dtype == 13 || dtype == 14; }

// Shape 7: a sparse chunked /tokens of about 2^40 elements (even byte) or of 2^62 (odd
// byte: two or three such files overflow an int64 token total, which TokenDataset must
// refuse; finding 6 in README.md).
hsize_t huge_dims(uint8_t h) {
  if (h % 2) return hsize_t{1} << 62;
  return (hsize_t{1} << 40) + h;
}

void write_vocab_attr(hid_t obj, const Plan& p, int64_t value) {
  if (p.vocab_form == 1) return;  // absent
  H space;
  size_t n = 1;
  if (p.vocab_form == 5) {
    space = H(ok(H5Screate(H5S_NULL)));
    n = 0;
  } else if (p.vocab_form == 6) {
    const hsize_t d[1] = {hsize_t{p.vocab_arg} % 9};
    space = H(ok(H5Screate_simple(1, d, nullptr)));
    n = d[0];
  } else {
    space = H(ok(H5Screate(H5S_SCALAR)));
  }
  H owned;
  hid_t type = H5T_STD_I64LE;
  if (p.vocab_form == 2) type = numeric_type(p.vocab_arg);
  if (p.vocab_form == 3) owned = fixed_string_type(8, 0);
  if (p.vocab_form == 4) owned = vlen_string_type(0);
  if (p.vocab_form == 7) owned = odd_type(p.vocab_arg);
  if (owned.ok()) type = owned.get();
  H attr(ok(H5Acreate2(obj, pipetrain::kVocabAttr, type, space.get(), H5P_DEFAULT, H5P_DEFAULT)));
  if (n == 0) return;
  const std::string text = std::to_string(value);
  if (p.vocab_form == 3) {
    std::string buf(8 * n, '\0');
    for (size_t i = 0; i < n; ++i) text.copy(&buf[i * 8], 8);
    ok_rc(H5Awrite(attr.get(), type, buf.data()));
  } else if (p.vocab_form == 4) {
    std::vector<const char*> v(n, text.c_str());
    ok_rc(H5Awrite(attr.get(), type, v.data()));
  } else if (p.vocab_form == 7) {
    write_pattern(attr.get(), type, n);
  } else {
    std::vector<int64_t> v(n, value);
    ok_rc(H5Awrite(attr.get(), H5T_NATIVE_INT64, v.data()));
  }
}

void write_tokenizer_attr(hid_t obj, const Plan& p) {
  if (p.tok_form == 1) return;  // absent
  H space;
  size_t n = 1;
  if (p.tok_form == 7) {
    space = H(ok(H5Screate(H5S_NULL)));
    n = 0;
  } else if (p.tok_form == 6) {
    const hsize_t d[1] = {hsize_t{p.tok_arg} % 4};
    space = H(ok(H5Screate_simple(1, d, nullptr)));
    n = d[0];
  } else if (p.tok_form == 10) {
    const hsize_t d[2] = {2, 2};
    space = H(ok(H5Screate_simple(2, d, nullptr)));
    n = 4;
  } else {
    space = H(ok(H5Screate(H5S_SCALAR)));
  }
  H type;
  switch (p.tok_form) {
    case 2: type = fixed_string_type(p.tokenizer.size(), 1); break;
    case 3: case 10: type = fixed_string_type(p.tokenizer.size(), 0); break;
    case 4: type = fixed_string_type(p.tokenizer.size(), 2); break;
    case 5: type = H(ok(H5Tcopy(H5T_STD_I32LE))); break;
    case 8: type = vlen_string_type(1); break;
    case 9: type = odd_type(p.tok_arg); break;
    default: type = vlen_string_type(0);  // 0, 6: as the writer
  }
  H attr(ok(H5Acreate2(obj, pipetrain::kTokenizerAttr, type.get(), space.get(), H5P_DEFAULT,
                       H5P_DEFAULT)));
  if (n == 0) return;
  if (p.tok_form == 5) {
    std::vector<int32_t> v(n, 42);
    ok_rc(H5Awrite(attr.get(), H5T_NATIVE_INT32, v.data()));
  } else if (p.tok_form == 9) {
    write_pattern(attr.get(), type.get(), n);
  } else if (H5Tis_variable_str(type.get()) > 0) {
    std::vector<const char*> v(n, p.tokenizer.c_str());
    ok_rc(H5Awrite(attr.get(), type.get(), v.data()));
  } else {
    const size_t size = H5Tget_size(type.get());
    std::string buf(size * n, p.tok_form == 4 ? ' ' : '\0');
    for (size_t i = 0; i < n; ++i) p.tokenizer.copy(&buf[i * size], size);
    ok_rc(H5Awrite(attr.get(), type.get(), buf.data()));
  }
}

struct Written {
  hsize_t declared = 0;  // 1-D: elements declared; others: npoints
  bool one_d = false;
};

// Creates the token dataset at `name`; returns what it declared.
Written write_dataset(hid_t file, const char* name, hid_t lcpl, const Plan& p) {
  H type = token_type(p.dtype);
  const size_t esize = H5Tget_size(type.get());
  Written w;
  const hsize_t n = p.count;
  bool need_chunks = false;
  H space;
  int rank = 1;
  hsize_t dims[3] = {n, 1, 1};
  switch (p.shape) {
    case 1:
      space = H(ok(H5Screate(H5S_SCALAR)));
      rank = 0;
      break;
    case 2:
      space = H(ok(H5Screate(H5S_NULL)));
      rank = -1;
      break;
    case 3:
      rank = 2;
      dims[0] = std::max<hsize_t>(1, n / 2);
      dims[1] = 2;
      break;
    case 4:
      rank = 3;
      dims[0] = std::max<hsize_t>(1, n / 4);
      dims[1] = dims[2] = 2;
      break;
    case 5: need_chunks = true; break;
    case 6:
      dims[0] = n + p.extra;
      need_chunks = true;
      break;
    case 7:
      dims[0] = huge_dims(p.huge);
      need_chunks = true;
      break;
    default: break;
  }
  if (rank >= 1) {
    hsize_t maxdims[3] = {dims[0], dims[1], dims[2]};
    if (p.shape >= 5) maxdims[0] = H5S_UNLIMITED;
    space = H(ok(H5Screate_simple(rank, dims, maxdims)));
  }
  w.one_d = rank == 1;
  const hssize_t np = H5Sget_simple_extent_npoints(space.get());
  w.declared = w.one_d ? dims[0] : static_cast<hsize_t>(std::max<hssize_t>(np, 0));

  H dcpl(ok(H5Pcreate(H5P_DATASET_CREATE)));
  const bool can_chunk = rank >= 1;
  const bool chunked = can_chunk && (need_chunks || (p.layout != 0 && p.layout != 5));
  if (chunked) {
    hsize_t c[3];
    for (int d = 0; d < rank; ++d) {
      const hsize_t want = p.layout == 7 ? 1 : p.chunk;
      c[d] = std::max<hsize_t>(1, p.shape >= 5 ? want : std::min(want, dims[d]));
    }
    ok_rc(H5Pset_chunk(dcpl.get(), rank, c));
    if (p.layout == 3) ok_rc(H5Pset_shuffle(dcpl.get()));
    if (p.layout == 2 || p.layout == 3) ok_rc(H5Pset_deflate(dcpl.get(), 1));
    if (p.layout == 4) ok_rc(H5Pset_fletcher32(dcpl.get()));
  } else if (p.layout == 5 && rank >= 0 && static_cast<size_t>(std::max<hssize_t>(np, 1)) * esize <= 60000) {
    ok_rc(H5Pset_layout(dcpl.get(), H5D_COMPACT));
  }
  if (p.layout == 6 && numeric(p.dtype)) {
    const uint32_t seven = 7;
    ok_rc(H5Pset_fill_value(dcpl.get(), H5T_NATIVE_UINT32, &seven));
    if (p.shape < 5) ok_rc(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY));
  } else if (p.layout == 0 && p.shape < 5) {
    ok_rc(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));  // as TokenFileWriter
  }
  H dset(ok(H5Dcreate2(file, name, type.get(), space.get(), lcpl, dcpl.get(), H5P_DEFAULT)));
  if (rank < 0) return w;  // null dataspace: nothing to write

  // What to write: the first `count` elements (1-D) or every element (otherwise).
  const size_t nw = w.one_d ? static_cast<size_t>(std::min<hsize_t>(n, dims[0]))
                            : static_cast<size_t>(std::max<hssize_t>(np, 0));
  if (nw == 0) return w;
  H file_space(ok(H5Dget_space(dset.get())));
  const hsize_t start = 0, cnt = nw;
  if (w.one_d) ok_rc(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &cnt, nullptr));
  H mem(ok(H5Screate_simple(1, &cnt, nullptr)));
  if (p.values == 1 || p.values == 2 || !numeric(p.dtype)) {
    std::string buf(nw * esize, p.values == 2 ? '\xff' : '\0');
    if (p.values == 1 && !p.raw.empty())
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = p.raw[i % p.raw.size()];
    else if (p.values != 2)
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>(i % 3);
    ok_rc(H5Dwrite(dset.get(), type.get(), mem.get(), file_space.get(), H5P_DEFAULT, buf.data()));
  } else {
    std::vector<uint32_t> v(nw);
    for (size_t i = 0; i < nw; ++i) v[i] = static_cast<uint32_t>(i % 256);
    if (p.values == 3) v[std::min(p.bad_at, nw - 1)] = 256;
    ok_rc(H5Dwrite(dset.get(), H5T_NATIVE_UINT32, mem.get(), file_space.get(), H5P_DEFAULT, v.data()));
  }
  return w;
}

// Writes the file; returns what /tokens declares (if it is a dataset).
std::optional<Written> write_file(const std::string& path, const Plan& p) {
  H fcpl(ok(H5Pcreate(H5P_FILE_CREATE)));
  if (p.flags & 8) ok_rc(H5Pset_userblock(fcpl.get(), 512));
  H fapl(ok(H5Pcreate(H5P_FILE_ACCESS)));
  if (p.flags & 1) ok_rc(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST));
  H file(ok(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get())));
  H lcpl(ok(H5Pcreate(H5P_LINK_CREATE)));
  ok_rc(H5Pset_create_intermediate_group(lcpl.get(), 1));

  std::optional<Written> w;
  H tokens_obj;  // what the attributes "on /tokens" go on
  switch (p.object) {
    case 0: w = write_dataset(file.get(), "tokens", lcpl.get(), p); break;
    case 1: (void)write_dataset(file.get(), "Tokens", lcpl.get(), p); break;
    case 2: tokens_obj = H(ok(H5Gcreate2(file.get(), "tokens", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT))); break;
    case 3: {
      H t = token_type(p.dtype);
      ok_rc(H5Tcommit2(file.get(), "tokens", t.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      break;
    }
    case 4:
      w = write_dataset(file.get(), "data/tok", lcpl.get(), p);
      ok_rc(H5Lcreate_soft("/data/tok", file.get(), "tokens", H5P_DEFAULT, H5P_DEFAULT));
      break;
    case 5: ok_rc(H5Lcreate_soft("/data/nothing", file.get(), "tokens", H5P_DEFAULT, H5P_DEFAULT)); break;
    case 6:
      ok_rc(H5Lcreate_external("pipetrain-fuzz-missing.h5", "/tokens", file.get(), "tokens",
                               H5P_DEFAULT, H5P_DEFAULT));
      break;
    default:
      w = write_dataset(file.get(), "data/tok", lcpl.get(), p);
      ok_rc(H5Lcreate_hard(file.get(), "/data/tok", file.get(), "tokens", H5P_DEFAULT, H5P_DEFAULT));
  }
  if (!tokens_obj.ok() && (p.object == 0 || p.object == 3 || p.object == 4 || p.object == 7))
    tokens_obj = H(ok(H5Oopen(file.get(), "tokens", H5P_DEFAULT)));

  const bool on_tokens = (p.flags & 6) && tokens_obj.ok();
  if (!on_tokens || (p.flags & 4)) {  // on the root (with flag 4: a conflicting vocab there)
    write_vocab_attr(file.get(), p, (p.flags & 4) && on_tokens ? 300 : p.vocab);
    write_tokenizer_attr(file.get(), p);
  }
  if (on_tokens) {
    write_vocab_attr(tokens_obj.get(), p, p.vocab);
    write_tokenizer_attr(tokens_obj.get(), p);
  }
  if (p.flags & 16) {
    H g(ok(H5Gcreate2(file.get(), "meta", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
    const hsize_t d = 3;
    H s(ok(H5Screate_simple(1, &d, nullptr)));
    H other(ok(H5Dcreate2(g.get(), "other", H5T_STD_I32LE, s.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  }
  tokens_obj = H();
  ok_rc(H5Fclose(file.release()));
  return w;
}

bool is_error(const auto& f) {
  try {
    f();
  } catch (const pipetrain::Error&) {
    return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  quiet_hdf5();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  const Plan p = read_plan(in);
  const std::string& path = temp_path("tokens");
  std::remove(path.c_str());

  const bool no_file = p.flags & 64, not_hdf5 = !no_file && (p.flags & 32);
  std::optional<Written> w;
  if (not_hdf5) {
    std::string junk = "tokens\n" + p.raw;
    for (auto& c : junk)
      if (c == 'H' || c == '\x89') c = '.';  // never an HDF5 signature
    std::ofstream(path, std::ios::binary) << junk;
  } else if (!no_file) {
    try {
      w = write_file(path, p);
    } catch (const Skip&) {
      note("generator: HDF5 refused this combination");
      require(open_hdf5_objects() == 0, "generator left HDF5 objects open");
      return -1;  // a combination HDF5 refuses to write: not an input worth keeping
    }
  }
  require(open_hdf5_objects() == 0, "generator left HDF5 objects open");

  // inspect_token_file
  std::optional<pipetrain::TokenFileInfo> info;
  try {
    info = pipetrain::inspect_token_file(path);
    note("inspect_token_file: " + info->dtype + ", " + std::to_string(info->num_tokens) +
         " tokens, vocab_size " + std::to_string(info->vocab_size) + ", tokenizer \"" +
         info->tokenizer + "\"");
  } catch (const pipetrain::Error& e) {
    note(std::string("inspect_token_file: ") + e.what());
  }
  require(open_hdf5_objects() == 0, "inspect_token_file left HDF5 objects open");
  if (no_file || not_hdf5) require(!info, "no file / not HDF5 is an error");
  if (info) {
    require(w.has_value() && w->one_d, "only a 1-D dataset /tokens is accepted");
    require(info->dtype == "uint16" || info->dtype == "uint32", "dtype is uint16 or uint32");
    require(info->num_tokens >= 0, "num_tokens >= 0");
    require(static_cast<hsize_t>(info->num_tokens) == w->declared, "num_tokens = declared length");
    require(info->vocab_size >= 0, "vocab_size >= 0");
  }
  // Oracle: the file exactly as TokenFileWriter writes it (attributes on the root).
  const bool writer_shaped = w && p.object == 0 && (p.dtype == 0 || p.dtype == 1) &&
                             (p.shape == 0 || p.shape == 5 || p.shape == 6) &&
                             !(p.flags & 6) && p.vocab_form == 0 && p.tok_form == 0;
  if (writer_shaped) {
    require(info.has_value() == (p.vocab > 0), "a writer-shaped file is accepted iff vocab_size > 0");
    if (info) {
      require(info->vocab_size == p.vocab, "vocab_size attribute");
      require(info->tokenizer == std::string(p.tokenizer.c_str()), "tokenizer attribute");
      require(info->dtype == (p.dtype == 0 ? "uint16" : "uint32"), "dtype");
    }
  }

  // TokenDataset and reads.
  try {
    const std::vector<std::string> files(static_cast<size_t>(p.nfiles), path);
    pipetrain::TokenDataset ds(files, p.seq_len, p.model_vocab);
    require(info.has_value(), "TokenDataset opens only what inspect_token_file accepts");
    require(ds.num_tokens() == p.nfiles * info->num_tokens, "num_tokens sums the files");
    require(ds.seq_len() == p.seq_len && p.seq_len >= 1, "seq_len");
    require(ds.num_tokens() >= int64_t{p.seq_len} + 1, "at least one window");
    require(ds.num_windows() == (ds.num_tokens() - 1) / p.seq_len, "num_windows");
    require(ds.vocab_size() == info->vocab_size && ds.vocab_size() <= p.model_vocab, "vocab_size");
    require(ds.tokenizer() == info->tokenizer, "tokenizer");

    const int64_t nw = ds.num_windows();
    note("TokenDataset: " + std::to_string(nw) + " windows");
    std::vector<int32_t> win(static_cast<size_t>(p.seq_len) + 1);
    for (const int64_t wi : {int64_t{0}, nw / 2, nw - 1}) {
      if (!is_error([&] { ds.read_window(wi, win.data()); }))
        for (const int32_t t : win)
          require(static_cast<uint32_t>(t) < static_cast<uint32_t>(p.model_vocab),
                  "read_window returns tokens < model vocab");
    }
    require(is_error([&] { ds.read_window(nw, win.data()); }), "read_window(num_windows) throws");
    require(is_error([&] { ds.read_window(-1, win.data()); }), "read_window(-1) throws");
    require(is_error([&] { ds.read_tokens(ds.num_tokens(), 1, win.data()); }),
            "read_tokens past the end throws");

    const int64_t first_n = std::min<int64_t>(ds.num_tokens(), 4096);
    std::vector<int32_t> head(static_cast<size_t>(first_n));
    const bool head_ok = !is_error([&] { ds.read_tokens(0, first_n, head.data()); });
    if (head_ok && numeric(p.dtype) && p.values == 0 && w->one_d && p.dtype <= 3) {
      const int64_t written = std::min<int64_t>(static_cast<int64_t>(p.count), info->num_tokens);
      for (int64_t i = 0; i < std::min(first_n, written); ++i)
        require(head[static_cast<size_t>(i)] == i % 256, "read_tokens returns what was written");
    }
    // A sequential sampler's first sample is window 0, shifted by one for the targets.
    pipetrain::BatchSampler sampler(ds, "sequential", 1);
    std::vector<int32_t> inputs(static_cast<size_t>(p.seq_len)), targets(inputs.size());
    if (!is_error([&] { sampler.load(0, 1, inputs.data(), targets.data()); }) &&
        !is_error([&] { ds.read_window(0, win.data()); }))
      for (size_t t = 0; t < inputs.size(); ++t)
        require(inputs[t] == win[t] && targets[t] == win[t + 1], "BatchSampler::load = window");
  } catch (const pipetrain::Error& e) {
    note(std::string("TokenDataset: ") + e.what());
  }
  require(open_hdf5_objects() == 0, "TokenDataset left HDF5 objects open");
  return 0;
}
