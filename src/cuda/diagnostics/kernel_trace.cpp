// CUPTI activity tracing for NIBBLE_DIAG_KERNEL_TRACE (kernel_trace.h): the library is opened with dlopen
// so that nibble runs where CUPTI is absent; records are copied out of CUPTI's buffers as they
// complete and written as CSV at the end.
#include "cuda/diagnostics/kernel_trace.h"

#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <vector>

#include "core/env.h"
#include "core/log.h"

namespace nibble::cuda {
namespace {

// The entry points used, resolved from the library at start.
struct Cupti {
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
};

struct Row {
  bool kernel = true;
  const char* name = nullptr;  // CUPTI's, shared by a kernel's records and kept for the process
  uint64_t start = 0, end = 0, node = 0, bytes = 0;
  uint32_t stream = 0, graph = 0, correlation = 0;
  int32_t grid = 0, block = 0, smem = 0, copy_kind = 0;
};

struct Trace {
  std::mutex mutex;
  Cupti api;
  bool active = false;
  std::string path;
  std::vector<Row> rows;
  std::vector<std::string> labels;
};

Trace& trace() {
  static Trace t;
  return t;
}

constexpr size_t BUFFER_BYTES = 8u << 20;
constexpr size_t MAX_ROWS = 4u << 20;  // ~4M kernels (~300 MB); later records are dropped

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, BUFFER_BYTES));
  *size = *buffer ? BUFFER_BYTES : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  Trace& t = trace();
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    CUpti_Activity* record = nullptr;
    while (t.api.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
      if (t.rows.size() >= MAX_ROWS) break;
      Row row;
      if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        row.name = k->name, row.start = k->start, row.end = k->end, row.node = k->graphNodeId;
        row.stream = k->streamId, row.graph = k->graphId, row.correlation = k->correlationId;
        row.grid = k->gridX * k->gridY * k->gridZ, row.block = k->blockX * k->blockY * k->blockZ;
        row.smem = k->dynamicSharedMemory + k->staticSharedMemory;
      } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        row.kernel = false, row.start = m->start, row.end = m->end, row.bytes = m->bytes, row.node = m->graphNodeId;
        row.stream = m->streamId, row.graph = m->graphId, row.correlation = m->correlationId,
        row.copy_kind = m->copyKind;
      } else {
        continue;
      }
      t.rows.push_back(row);
    }
  }
  std::free(buffer);
}

// "skinny_moe_kernel" from "void nibble::cuda::(anonymous namespace)::skinny_moe_kernel<4, 2>(…)":
// the function's own name, without namespaces, template arguments or parameters.
std::string short_name(const char* mangled) {
  if (!mangled) return "?";
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  size_t cut = name.size();
  for (size_t i = 0; i < name.size(); ++i) {  // the first '<' or '(' outside "(anonymous namespace)"
    if (name.compare(i, 21, "(anonymous namespace)") == 0) {
      i += 20;
      continue;
    }
    if (name[i] == '<' || name[i] == '(') {
      cut = i;
      break;
    }
  }
  name.resize(cut);
  const size_t space = name.rfind(' ');  // a return type before the name
  if (space != std::string::npos) name = name.substr(space + 1);
  const size_t scope = name.rfind("::");
  return scope == std::string::npos ? name : name.substr(scope + 2);
}

const char* copy_kind_name(int kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "memcpy DtoD";
    default:
      return "memcpy";
  }
}

std::string cupti_error(const char* what, CUptiResult r) {
  return std::string(what) + " failed (CUPTI error " + std::to_string(r) + ")";
}

}  // namespace

Status kernel_trace_start_from_env() {
  Trace& t = trace();
  const char* path = env_value("NIBBLE_DIAG_KERNEL_TRACE");
  if (!path || !*path || t.active) return Status::ok();
  const char* library = env_value("NIBBLE_DIAG_CUPTI_LIBRARY");
  void* handle = dlopen(library && *library ? library : "libcupti.so.13", RTLD_NOW | RTLD_GLOBAL);
  if (!handle)
    return Status::error(std::string("NIBBLE_DIAG_KERNEL_TRACE: could not load CUPTI (") + dlerror() +
                         "); set NIBBLE_DIAG_CUPTI_LIBRARY to libcupti.so's path");
  Cupti api;
  api.register_callbacks =
      reinterpret_cast<decltype(api.register_callbacks)>(dlsym(handle, "cuptiActivityRegisterCallbacks"));
  api.enable = reinterpret_cast<decltype(api.enable)>(dlsym(handle, "cuptiActivityEnable"));
  api.disable = reinterpret_cast<decltype(api.disable)>(dlsym(handle, "cuptiActivityDisable"));
  api.flush_all = reinterpret_cast<decltype(api.flush_all)>(dlsym(handle, "cuptiActivityFlushAll"));
  api.next_record = reinterpret_cast<decltype(api.next_record)>(dlsym(handle, "cuptiActivityGetNextRecord"));
  if (!api.register_callbacks || !api.enable || !api.disable || !api.flush_all || !api.next_record)
    return Status::error("NIBBLE_DIAG_KERNEL_TRACE: the CUPTI library lacks the activity API");
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    t.api = api;
  }
  if (CUptiResult r = api.register_callbacks(buffer_requested, buffer_completed); r != CUPTI_SUCCESS)
    return Status::error(cupti_error("cuptiActivityRegisterCallbacks", r));
  for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY})
    if (CUptiResult r = api.enable(kind); r != CUPTI_SUCCESS)
      return Status::error(cupti_error("cuptiActivityEnable", r));
  t.path = path;
  t.active = true;
  log_info(std::string("tracing every kernel into ") + path + " (CUPTI)");
  return Status::ok();
}

bool kernel_trace_active() { return trace().active; }

void kernel_trace_label(const std::string& label) {
  Trace& t = trace();
  if (!t.active) return;
  std::lock_guard<std::mutex> lock(t.mutex);
  t.labels.push_back(label);
}

Status kernel_trace_finish() {
  Trace& t = trace();
  if (!t.active) return Status::ok();
  t.api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  t.api.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  t.api.disable(CUPTI_ACTIVITY_KIND_MEMCPY);
  t.active = false;
  std::lock_guard<std::mutex> lock(t.mutex);
  std::sort(t.rows.begin(), t.rows.end(), [](const Row& a, const Row& b) { return a.start < b.start; });
  std::ofstream out(t.path);
  if (!out) return Status::error("NIBBLE_DIAG_KERNEL_TRACE: cannot write " + t.path);
  out << "kind,name,start_ns,end_ns,stream,graph,node,correlation,grid,block,smem,bytes\n";
  for (size_t i = 0; i < t.labels.size(); ++i) out << "label,\"" << t.labels[i] << "\"," << i << ",,,,,,,,,\n";
  const uint64_t origin = t.rows.empty() ? 0 : t.rows.front().start;
  std::map<const char*, std::string> names;  // demangled once a kernel
  for (const Row& r : t.rows) {
    if (r.kernel) {
      auto name = names.find(r.name);
      if (name == names.end()) name = names.emplace(r.name, short_name(r.name)).first;
      out << "kernel," << name->second;
    } else {
      out << "copy," << copy_kind_name(r.copy_kind);
    }
    out << ',' << r.start - origin << ',' << r.end - origin << ',' << r.stream << ',' << r.graph << ',' << r.node << ','
        << r.correlation << ',' << r.grid << ',' << r.block << ',' << r.smem << ',' << r.bytes << '\n';
  }
  log_info("kernel trace: " + std::to_string(t.rows.size()) + " records, " + std::to_string(t.labels.size()) +
           " step labels written to " + t.path +
           (t.rows.size() >= MAX_ROWS ? " (record limit reached: later ones dropped)" : ""));
  return out ? Status::ok() : Status::error("NIBBLE_DIAG_KERNEL_TRACE: writing " + t.path + " failed");
}

}  // namespace nibble::cuda
