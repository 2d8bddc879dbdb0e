// Fuzz target: checkpoint metadata (read_checkpoint_meta of pipetrain/io/checkpoint.hpp),
// and list_checkpoint / verify_checkpoint on the same file. Structure-aware: the input
// drives a generator that writes a well-formed HDF5 file through the HDF5 C API (never
// raw bytes: HDF5's own parser is not under test), shaped like what write_checkpoint()
// writes, with each root attribute present or not, of the right or a wrong HDF5 type,
// scalar or not, and with ordinary or extreme values. read_checkpoint_meta must return or
// throw CheckpointUnreadable, list_checkpoint / verify_checkpoint return or throw
// pipetrain::Error; anything else is a finding, and so is an HDF5 object left open.
//
// Input layout (every byte read past the end is 0 = what write_checkpoint writes, so the
// empty input is a valid checkpoint):
//   byte 0   file flags: 1 libver latest, 2 attributes in reverse order, 4 add datasets
//            (then list_checkpoint and verify_checkpoint run too), 8 512-byte user
//            block, 16 twenty extra attributes, 32 not an HDF5 file at all (text, no
//            signature), 64 no file
//   then per attribute, in the order format_version step tokens_seen samples_seen seed
//   grid_dp grid_pp grid_tp zero1 schedule config:
//     form byte (% 16): 0 and 11-15 as written by write_checkpoint; 1 absent; 2 another
//       numeric type (+1 byte); 3 fixed-length string (+1 style byte); 4 variable-length
//       string (+1 byte); 5 null dataspace; 6 1-D dataspace (+1 byte: 0..8 elements);
//       7 2-D dataspace (+2 bytes); 8 enum/compound/opaque/bitfield/reference/array
//       (+1 byte); 9 HDF5 array type of the right base type (+1 byte); 10 misspelt name
//     value byte: numbers (% 12): 0/11 the default, 1 zero, 2 -1, 3 INT32_MAX,
//       4 2^31, 5 INT64_MIN, 6 INT64_MAX, 7 8 raw bytes follow, 8 1 raw signed byte
//       follows, 9 two, 10 INT32_MIN; strings (% 8): 0/7 the default, 1 empty, 2 text
//       from the input (2 length bytes), 3 embedded NUL, 4 'x' repeated (2 length
//       bytes), 5 trailing spaces, 6 NULs only
//   with flag 4: 1 byte number of datasets (1..3), per dataset 1 byte type, 1 byte rank,
//     up to 3 dimension bytes (0..4), 1 byte layout; then 1 byte link flags: 1 soft link
//     to a dataset, 2 dangling soft link, 4 external link, 8 empty group, 16 a group
//     /loop with a hard link back to / (with 32: a soft link to /loop instead).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/io/checkpoint.hpp"

namespace {

using namespace pipetrain_fuzz;

enum class Kind { I32, I64, U64, Str };

struct Spec {
  const char* name;
  Kind kind;
  int64_t def;
  const char* def_text;
};

const Spec kSpecs[] = {
    {"format_version", Kind::I32, 1, nullptr},
    {"step", Kind::I64, 120, nullptr},
    {"tokens_seen", Kind::I64, 491520, nullptr},
    {"samples_seen", Kind::I64, 480, nullptr},
    {"seed", Kind::U64, 1337, nullptr},
    {"grid_dp", Kind::I32, 1, nullptr},
    {"grid_pp", Kind::I32, 2, nullptr},
    {"grid_tp", Kind::I32, 1, nullptr},
    {"zero1", Kind::I32, 0, nullptr},
    {"schedule", Kind::Str, 0, "1f1b"},
    {"config", Kind::Str, 0, "[model]\nn_layer = 2\nn_head = 2\nd_model = 64\n\n[train]\nsteps = 10\n"},
};
constexpr size_t kNumSpecs = sizeof(kSpecs) / sizeof(kSpecs[0]);

struct Attr {
  int form = 0;      // as in the layout comment
  uint8_t arg = 0;   // the form's extra byte
  uint8_t arg2 = 0;
  int64_t value = 0; // numbers (bit pattern for U64)
  std::string text;  // strings
  bool writer_layout() const { return form == 0 || form >= 11; }
};

int64_t number(Bytes& in, const Spec& s) {
  switch (in.u8() % 12) {
    case 1: return 0;
    case 2: return -1;
    case 3: return std::numeric_limits<int32_t>::max();
    case 4: return int64_t{1} << 31;
    case 5: return std::numeric_limits<int64_t>::min();
    case 6: return std::numeric_limits<int64_t>::max();
    case 7: return static_cast<int64_t>(in.u64());
    case 8: return static_cast<int8_t>(in.u8());
    case 9: return 2;
    case 10: return std::numeric_limits<int32_t>::min();
    default: return s.def;
  }
}

std::string text(Bytes& in, const Spec& s) {
  const std::string def = s.def_text;
  switch (in.u8() % 8) {
    case 1: return "";
    case 2: return in.str(in.u16() % 3000);
    case 3: return def + std::string(1, '\0') + "junk";
    case 4: return std::string(in.u16() % 70000 + 1, 'x');
    case 5: return def + "   ";
    case 6: return std::string(in.u8() % 16 + 1, '\0');
    default: return def;
  }
}

// The file type write_checkpoint uses for a kind (strings: fixed, NULLPAD, see there).
hid_t writer_type(Kind k) {
  switch (k) {
    case Kind::I32: return H5T_NATIVE_INT;
    case Kind::I64: return H5T_NATIVE_INT64;
    default: return H5T_NATIVE_UINT64;
  }
}

hid_t memory_type(Kind k) { return k == Kind::U64 ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64; }

// 1-D and 2-D attributes have up to 8 elements: the reader must refuse anything but one
// (findings 3 and 4 in README.md: it once read them into room for one).
constexpr size_t kMaxPoints = 8;

void write_attr(hid_t obj, const Spec& s, const Attr& a) {
  if (a.form == 1) return;  // absent
  std::string name = s.name;
  if (a.form == 10) name += " ";
  // Dataspace.
  H space;
  size_t npoints = 1;
  if (a.form == 5) {
    space = H(ok(H5Screate(H5S_NULL)));
    npoints = 0;
  } else if (a.form == 6) {
    const hsize_t dims[1] = {std::min<hsize_t>(a.arg % 9, kMaxPoints)};
    space = H(ok(H5Screate_simple(1, dims, nullptr)));
    npoints = dims[0];
  } else if (a.form == 7) {
    hsize_t dims[2] = {hsize_t{a.arg} % 3, hsize_t{a.arg2} % 3};
    if (dims[0] * dims[1] > kMaxPoints) dims[0] = dims[1] = 1;
    space = H(ok(H5Screate_simple(2, dims, nullptr)));
    npoints = dims[0] * dims[1];
  } else {
    space = H(ok(H5Screate(H5S_SCALAR)));
  }
  const size_t nbuf = std::max<size_t>(1, npoints);

  // Type and the bytes to write.
  const bool is_str = s.kind == Kind::Str;
  const std::string as_text = is_str ? a.text : std::to_string(a.value);
  H owned;  // a type we created
  hid_t type = -1;
  enum { Num, Fixed, Vlen, Odd, NumArray } how = is_str ? Fixed : Num;
  switch (a.form) {
    case 2:
      type = numeric_type(a.arg);
      how = Num;
      break;
    case 3:
      owned = fixed_string_type(as_text.size(), a.arg);
      how = Fixed;
      break;
    case 4:
      owned = vlen_string_type(a.arg);
      how = Vlen;
      break;
    case 8:
      owned = odd_type(a.arg);
      how = Odd;
      break;
    case 9: {
      const hsize_t dims[1] = {hsize_t{a.arg} % 4 + 1};
      if (is_str) {
        H base = fixed_string_type(as_text.size(), 0);
        owned = H(ok(H5Tarray_create2(base.get(), 1, dims)));
        how = Odd;
      } else {
        owned = H(ok(H5Tarray_create2(writer_type(s.kind), 1, dims)));
        how = NumArray;
      }
      break;
    }
    default:
      if (is_str)
        owned = fixed_string_type(as_text.size(), 0);  // NULLPAD, ASCII: as the writer
      else
        type = writer_type(s.kind);
  }
  if (owned.ok()) type = owned.get();

  H attr(ok(H5Acreate2(obj, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT)));
  if (npoints == 0) return;
  switch (how) {
    case Num: {
      if (is_str) {  // a string attribute stored as a number
        std::vector<int64_t> v(nbuf, 7);
        ok_rc(H5Awrite(attr.get(), H5T_NATIVE_INT64, v.data()));
      } else {
        std::vector<int64_t> v(nbuf, a.value);
        ok_rc(H5Awrite(attr.get(), memory_type(s.kind), v.data()));
      }
      break;
    }
    case NumArray: {
      const size_t per = H5Tget_size(type) / H5Tget_size(writer_type(s.kind));
      const hsize_t dims[1] = {per};
      H mem(ok(H5Tarray_create2(memory_type(s.kind), 1, dims)));
      std::vector<int64_t> v(nbuf * per, a.value);
      ok_rc(H5Awrite(attr.get(), mem.get(), v.data()));
      break;
    }
    case Fixed: {
      const size_t size = H5Tget_size(type);
      std::string buf(size * nbuf, '\0');
      for (size_t i = 0; i < nbuf; ++i) as_text.copy(&buf[i * size], size);
      ok_rc(H5Awrite(attr.get(), type, buf.data()));
      break;
    }
    case Vlen: {
      std::vector<const char*> v(nbuf, as_text.c_str());
      ok_rc(H5Awrite(attr.get(), type, v.data()));
      break;
    }
    case Odd:
      write_pattern(attr.get(), type, npoints);
      break;
  }
}

// Small datasets like the checkpoint's tensors (and some that are not), for
// list_checkpoint and verify_checkpoint; optionally links that make the group graph
// cyclic.
void write_datasets(hid_t file, Bytes& in) {
  static const char* const kNames[] = {"params/wte", "params/h.0.attn.qkv.w", "adam_m/wte",
                                       "adam_v/h.0.mlp.fc.b"};
  H lcpl(ok(H5Pcreate(H5P_LINK_CREATE)));
  ok_rc(H5Pset_create_intermediate_group(lcpl.get(), 1));
  const int n = in.u8() % 3 + 1;
  for (int i = 0; i < n; ++i) {
    const uint8_t tb = in.u8();
    const hid_t type = tb == 0 ? H5T_IEEE_F32LE : numeric_type(tb);
    const int rank = in.u8() % 4;  // 0 = scalar
    hsize_t dims[3] = {1, 1, 1};
    for (int d = 0; d < rank; ++d) {
      const uint8_t b = in.u8();
      dims[d] = b == 0 ? 3 : b % 5;
    }
    H space(ok(rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims, nullptr)));
    H dcpl(ok(H5Pcreate(H5P_DATASET_CREATE)));
    const uint8_t layout = in.u8() % 3;
    bool nonzero = rank == 0;
    if (rank > 0) nonzero = dims[0] * dims[1] * dims[2] > 0;
    if (layout == 0 && rank > 0 && nonzero) {  // as the writer: chunked + Fletcher32
      ok_rc(H5Pset_chunk(dcpl.get(), rank, dims));
      ok_rc(H5Pset_fletcher32(dcpl.get()));
      ok_rc(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));
    } else if (layout == 1 && rank > 0 && nonzero) {
      ok_rc(H5Pset_chunk(dcpl.get(), rank, dims));
      ok_rc(H5Pset_deflate(dcpl.get(), 1));
    }
    H dset(ok(H5Dcreate2(file, kNames[i], type, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT)));
    const hssize_t np = H5Sget_simple_extent_npoints(space.get());
    std::vector<float> v(static_cast<size_t>(std::max<hssize_t>(np, 1)));
    for (size_t k = 0; k < v.size(); ++k) v[k] = 0.25f * static_cast<float>(k);
    if (np > 0) ok_rc(H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
  }
  const uint8_t links = in.u8();
  if (links & 1) ok_rc(H5Lcreate_soft("/params/wte", file, "alias", H5P_DEFAULT, H5P_DEFAULT));
  if (links & 2) ok_rc(H5Lcreate_soft("/nowhere", file, "dangling", H5P_DEFAULT, H5P_DEFAULT));
  if (links & 4)
    ok_rc(H5Lcreate_external("missing-file.h5", "/x", file, "external", H5P_DEFAULT, H5P_DEFAULT));
  if (links & 8) {
    H g(ok(H5Gcreate2(file, "empty_group", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  }
  // A link back to an ancestor group (a cycle): the walk must stop (finding 5).
  if (links & 16) {
    H g(ok(H5Gcreate2(file, "loop", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
    if (links & 32)
      ok_rc(H5Lcreate_soft("/loop", g.get(), "again", H5P_DEFAULT, H5P_DEFAULT));
    else
      ok_rc(H5Lcreate_hard(file, "/", g.get(), "root", H5P_DEFAULT, H5P_DEFAULT));
  }
}

// What the reader returns for a fixed-length string attribute: the text up to the first
// NUL, without trailing spaces (h5io::read_string_attr; also reads space-padded strings).
std::string read_back(const std::string& written) {
  std::string s = written.substr(0, written.find('\0'));
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

int64_t clamp_i32(int64_t v) {
  return std::clamp<int64_t>(v, std::numeric_limits<int32_t>::min(),
                             std::numeric_limits<int32_t>::max());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  quiet_hdf5();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  const uint8_t flags = in.u8();
  Attr attrs[kNumSpecs];
  for (size_t i = 0; i < kNumSpecs; ++i) {
    Attr& a = attrs[i];
    a.form = in.u8() % 16;
    if (a.form == 2 || a.form == 3 || a.form == 4 || a.form == 6 || a.form == 8 || a.form == 9)
      a.arg = in.u8();
    if (a.form == 7) a.arg = in.u8(), a.arg2 = in.u8();
    if (kSpecs[i].kind == Kind::Str)
      a.text = text(in, kSpecs[i]);
    else
      a.value = number(in, kSpecs[i]);
  }

  const std::string& path = temp_path("ckpt");
  std::remove(path.c_str());
  const bool no_file = flags & 64, not_hdf5 = !no_file && (flags & 32);
  const bool with_datasets = !no_file && !not_hdf5 && (flags & 4);
  if (not_hdf5) {
    std::string junk = "not a checkpoint\n" + in.str(64);
    for (auto& c : junk)
      if (c == 'H' || c == '\x89') c = '.';  // never an HDF5 signature
    std::ofstream(path, std::ios::binary) << junk;
  } else if (!no_file) {
    try {
      H fcpl(ok(H5Pcreate(H5P_FILE_CREATE)));
      if (flags & 8) ok_rc(H5Pset_userblock(fcpl.get(), 512));
      H fapl(ok(H5Pcreate(H5P_FILE_ACCESS)));
      if (flags & 1) ok_rc(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST));
      H file(ok(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get())));
      for (size_t k = 0; k < kNumSpecs; ++k) {
        const size_t i = (flags & 2) ? kNumSpecs - 1 - k : k;
        write_attr(file.get(), kSpecs[i], attrs[i]);
      }
      if (flags & 16)
        for (int k = 0; k < 20; ++k) {
          H space(ok(H5Screate(H5S_SCALAR)));
          H attr(ok(H5Acreate2(file.get(), ("extra_" + std::to_string(k)).c_str(), H5T_NATIVE_INT,
                               space.get(), H5P_DEFAULT, H5P_DEFAULT)));
          ok_rc(H5Awrite(attr.get(), H5T_NATIVE_INT, &k));
        }
      if (with_datasets) write_datasets(file.get(), in);
      ok_rc(H5Fclose(file.release()));
    } catch (const Skip&) {
      note("generator: HDF5 refused this combination");
      require(open_hdf5_objects() == 0, "generator left HDF5 objects open");
      return -1;  // a combination HDF5 refuses to write: not an input worth keeping
    }
  }
  require(open_hdf5_objects() == 0, "generator left HDF5 objects open");

  bool read_ok = false;
  pipetrain::CheckpointMeta m;
  try {
    m = pipetrain::read_checkpoint_meta(path);
    read_ok = true;
    note("read_checkpoint_meta: ok, step " + std::to_string(m.step) + ", schedule \"" +
         m.schedule + "\"");
  } catch (const pipetrain::CheckpointUnreadable& e) {
    note(std::string("read_checkpoint_meta: ") + e.what());
  } catch (const pipetrain::Error& e) {
    std::fprintf(stderr, "read_checkpoint_meta: %s\n", e.what());
    require(false, "read_checkpoint_meta throws CheckpointUnreadable (--resume auto skips those)");
  }
  require(open_hdf5_objects() == 0, "read_checkpoint_meta left HDF5 objects open");

  // Oracle: a file laid out exactly as write_checkpoint writes it reads back what was
  // written (strings as read_back() says), unless a value is one the reader refuses.
  bool writer_layout = !no_file && !not_hdf5;
  for (const auto& a : attrs) writer_layout = writer_layout && a.writer_layout();
  if (writer_layout) {
    const bool version_ok = clamp_i32(attrs[0].value) == pipetrain::kCheckpointFormatVersion;
    // Negative counters and a grid dimension below 1 are damage, refused by the reader.
    const bool values_ok = attrs[1].value >= 0 && attrs[2].value >= 0 && attrs[3].value >= 0 &&
                           clamp_i32(attrs[5].value) >= 1 && clamp_i32(attrs[6].value) >= 1 &&
                           clamp_i32(attrs[7].value) >= 1;
    require(read_ok == (version_ok && values_ok),
            "a writer-shaped file reads unless its version differs or a value is out of range");
    if (read_ok) {
      require(m.format_version == clamp_i32(attrs[0].value), "format_version");
      require(m.step == attrs[1].value && m.tokens_seen == attrs[2].value &&
                  m.samples_seen == attrs[3].value,
              "step, tokens_seen, samples_seen");
      require(m.seed == static_cast<uint64_t>(attrs[4].value), "seed");
      require(m.grid.dp == clamp_i32(attrs[5].value) && m.grid.pp == clamp_i32(attrs[6].value) &&
                  m.grid.tp == clamp_i32(attrs[7].value) && m.grid.cp == 1 && m.grid.ep == 1,
              "grid");
      require(m.zero1 == (clamp_i32(attrs[8].value) != 0), "zero1");
      require(m.schedule == read_back(attrs[9].text), "schedule");
      require(m.config_toml == read_back(attrs[10].text), "config");
    }
  }
  if (no_file || not_hdf5) require(!read_ok, "no file / not HDF5 is an error");

  if (with_datasets) {
    try {
      (void)pipetrain::list_checkpoint(path);
    } catch (const pipetrain::Error&) {
    }
    require(open_hdf5_objects() == 0, "list_checkpoint left HDF5 objects open");
    try {
      (void)pipetrain::verify_checkpoint(path);
    } catch (const pipetrain::Error&) {
    }
    require(open_hdf5_objects() == 0, "verify_checkpoint left HDF5 objects open");
  }
  return 0;
}
