// Helpers shared by the fuzz targets of tests/fuzz (see README.md there).
//  - Bytes: reads an input front to back; once it runs out every read returns 0, and
//    every generator maps 0 to "what pipetrain itself writes", so the empty input is a
//    well-formed file and each byte of a seed is one readable choice.
//  - verbose()/note(): PIPETRAIN_FUZZ_VERBOSE=1 prints each input's outcome.
//  - require(): a property that must hold; __builtin_trap() otherwise (a finding).
//  - TempPath: one scratch file per process, removed at exit.
//  - H5 helpers for the structure-aware HDF5 generators: the file is always written
//    through the HDF5 C API (never raw bytes: HDF5 1.10's own parser is not under test).
#pragma once
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace pipetrain_fuzz {

class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool empty() const { return p_ == end_; }
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  uint8_t u8() { return p_ == end_ ? 0 : *p_++; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
  uint32_t u32() { return u16() | (static_cast<uint32_t>(u16()) << 16); }
  uint64_t u64() { return u32() | (static_cast<uint64_t>(u32()) << 32); }
  // Up to n bytes (fewer when the input runs out).
  std::string str(size_t n) {
    n = std::min(n, left());
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  // The rest of the input.
  std::string rest() { return str(left()); }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// A property of our code that must hold: a failure is a finding, like a crash.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "pipetrain fuzz: property violated: %s\n", what);
    __builtin_trap();
  }
}

// PIPETRAIN_FUZZ_VERBOSE=1: say what happened to each input (for writing seeds).
inline bool verbose() {
  static const bool on = [] {
    const char* s = std::getenv("PIPETRAIN_FUZZ_VERBOSE");
    return s && *s && std::strcmp(s, "0") != 0;
  }();
  return on;
}
inline void note(const std::string& what) {
  if (verbose()) std::fprintf(stderr, "pipetrain fuzz: %s\n", what.c_str());
}

// One scratch file per process ($TMPDIR or /tmp, with the pid), removed at exit.
inline const std::string& temp_path(const char* tag) {
  static const std::string path = [tag] {
    const char* dir = std::getenv("TMPDIR");
    std::string p = std::string(dir && *dir ? dir : "/tmp") + "/pipetrain-fuzz-" + tag + "-" +
                    std::to_string(::getpid()) + ".h5";
    return p;
  }();
  static const bool registered = [] {
    std::atexit([] { std::remove(path.c_str()); });
    return true;
  }();
  (void)registered;
  return path;
}

// ---- HDF5 generator helpers ------------------------------------------------------------

// Owns an id of the generator (closed with H5Oclose/H5Sclose/... via H5Idec_ref).
class H {
 public:
  H() = default;
  explicit H(hid_t id) : id_(id) {}
  ~H() {
    if (id_ >= 0) H5Idec_ref(id_);
  }
  H(const H&) = delete;
  H& operator=(const H&) = delete;
  H(H&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  H& operator=(H&& o) noexcept {
    if (this != &o) {
      if (id_ >= 0) H5Idec_ref(id_);
      id_ = o.id_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  // Gives the id up (the caller closes it).
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Generator step failed (an HDF5 call refused a combination): skip this input.
struct Skip {};
inline hid_t ok(hid_t id) {
  if (id < 0) throw Skip{};
  return id;
}
inline void ok_rc(herr_t rc) {
  if (rc < 0) throw Skip{};
}

// Numeric file types a generator picks from (index 0 is the caller's own default).
inline hid_t numeric_type(uint8_t k) {
  switch (k % 12) {
    case 0: return H5T_STD_I8LE;
    case 1: return H5T_STD_U8LE;
    case 2: return H5T_STD_I16BE;
    case 3: return H5T_STD_U16LE;
    case 4: return H5T_STD_I32BE;
    case 5: return H5T_STD_U32BE;
    case 6: return H5T_STD_I64BE;
    case 7: return H5T_STD_U64LE;
    case 8: return H5T_IEEE_F32LE;
    case 9: return H5T_IEEE_F64BE;
    case 10: return H5T_NATIVE_INT;
    default: return H5T_STD_I64LE;
  }
}

// A fixed-length string type of `size` bytes with the given padding / character set.
inline H fixed_string_type(size_t size, uint8_t style) {
  H t(ok(H5Tcopy(H5T_C_S1)));
  ok_rc(H5Tset_size(t.get(), std::max<size_t>(1, size)));
  const H5T_str_t pads[] = {H5T_STR_NULLPAD, H5T_STR_NULLTERM, H5T_STR_SPACEPAD};
  ok_rc(H5Tset_strpad(t.get(), pads[style % 3]));
  ok_rc(H5Tset_cset(t.get(), (style / 3) % 2 ? H5T_CSET_UTF8 : H5T_CSET_ASCII));
  return t;
}

inline H vlen_string_type(uint8_t style) {
  H t(ok(H5Tcopy(H5T_C_S1)));
  ok_rc(H5Tset_size(t.get(), H5T_VARIABLE));
  ok_rc(H5Tset_cset(t.get(), style % 2 ? H5T_CSET_ASCII : H5T_CSET_UTF8));
  return t;
}

// A type that is neither integer, float nor string: enum, compound, opaque, bitfield,
// reference, or an array of int32.
inline H odd_type(uint8_t k) {
  switch (k % 6) {
    case 0: {
      H t(ok(H5Tenum_create(H5T_NATIVE_INT)));
      int v = 1;
      ok_rc(H5Tenum_insert(t.get(), "one", &v));
      return t;
    }
    case 1: {
      H t(ok(H5Tcreate(H5T_COMPOUND, 8)));
      ok_rc(H5Tinsert(t.get(), "a", 0, H5T_NATIVE_INT));
      ok_rc(H5Tinsert(t.get(), "b", 4, H5T_NATIVE_INT));
      return t;
    }
    case 2: {
      H t(ok(H5Tcreate(H5T_OPAQUE, 8)));
      ok_rc(H5Tset_tag(t.get(), "pipetrain-fuzz"));
      return t;
    }
    case 3: return H(ok(H5Tcopy(H5T_STD_B32LE)));
    case 4: return H(ok(H5Tcopy(H5T_STD_REF_OBJ)));
    default: {
      const hsize_t dims[1] = {2};
      return H(ok(H5Tarray_create2(H5T_NATIVE_INT, 1, dims)));
    }
  }
}

// Writes `n` elements of a buffer of `elem_size`-byte zeros-or-pattern into attribute
// `attr` of type `type` (used for the odd types, whose value does not matter).
inline void write_pattern(hid_t attr, hid_t type, size_t npoints) {
  const size_t size = H5Tget_size(type);
  std::vector<unsigned char> buf(std::max<size_t>(1, size * std::max<size_t>(1, npoints)), 0);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 7 + 1);
  if (H5Tget_class(type) == H5T_REFERENCE) std::fill(buf.begin(), buf.end(), 0);
  ok_rc(H5Awrite(attr, type, buf.data()));
}

// Number of HDF5 objects still open anywhere (files, datasets, ...): our readers must
// leave none behind.
inline ssize_t open_hdf5_objects() { return H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL); }

// Once per process: HDF5 prints no error stacks (the generator provokes many).
inline void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

}  // namespace pipetrain_fuzz
