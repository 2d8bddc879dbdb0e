#include "pipetrain/comm/mpi_tool_vars.hpp"

#include <mpi.h>

#include <cstring>

namespace pipetrain {

namespace {

// Calls f(handle) for the integer control variable `want`, inside its own MPI_T session
// (MPI_T may be initialised any number of times, before or after MPI_Init).
template <typename F>
void with_int_variable(const char* want, F&& f) {
  int provided = 0, n = 0;
  if (MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return;
  MPI_T_cvar_get_num(&n);
  for (int i = 0; i < n; ++i) {
    char name[256], desc[8];
    int name_len = sizeof name, desc_len = sizeof desc, verbosity = 0, bind = 0, scope = 0, count = 0;
    MPI_Datatype type;
    MPI_T_enum values;
    MPI_T_cvar_handle h;
    if (MPI_T_cvar_get_info(i, name, &name_len, &verbosity, &type, &values, desc, &desc_len, &bind, &scope) !=
            MPI_SUCCESS ||
        type != MPI_INT || std::strcmp(name, want) != 0)
      continue;
    if (MPI_T_cvar_handle_alloc(i, nullptr, &h, &count) == MPI_SUCCESS) {
      f(h);
      MPI_T_cvar_handle_free(&h);
    }
    break;
  }
  MPI_T_finalize();
}

}  // namespace

int mpi_tool_int(const char* name) {
  int value = -1;
  with_int_variable(name, [&](MPI_T_cvar_handle h) {
    if (MPI_T_cvar_read(h, &value) != MPI_SUCCESS) value = -1;
  });
  return value;
}

bool choose_mpi_tool_int(const char* name, int value, int unset) {
  bool written = false;
  with_int_variable(name, [&](MPI_T_cvar_handle h) {
    int now = -1;
    if (MPI_T_cvar_read(h, &now) == MPI_SUCCESS && now == unset) written = MPI_T_cvar_write(h, &value) == MPI_SUCCESS;
  });
  return written;
}

}  // namespace pipetrain
