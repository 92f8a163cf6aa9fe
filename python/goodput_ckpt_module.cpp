// Python binding of the flash-checkpoint library. The Python side (goodput/checkpoint.py) turns
// state dicts into named byte buffers; this module moves the bytes, with the GIL released.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "agent/checkpoint/flash_checkpoint.h"

namespace py = pybind11;
using namespace goodput::ckpt;

namespace {

// One buffer of a loaded checkpoint, exposed through the buffer protocol; it keeps the whole
// checkpoint's memory alive for as long as any view of it lives (torch.frombuffer holds it).
struct LoadedBuffer {
  std::shared_ptr<Loaded> owner;
  uint8_t* data;
  uint64_t nbytes;
  bool readonly;  // a view of the shared-memory mapping itself
};

py::dict loaded_to_dict(std::shared_ptr<Loaded> l, bool zero_copy) {
  py::dict out;
  out["step"] = l->manifest.step;
  out["tier"] = tier_name(l->tier);
  out["source"] = l->source;
  out["seconds"] = l->seconds;
  out["skipped"] = l->skipped;
  py::list buffers;
  for (const BufferInfo& b : l->manifest.buffers) {
    py::dict d;
    d["name"] = b.name;
    d["dtype"] = b.dtype;
    d["shape"] = b.shape;
    d["nbytes"] = b.nbytes;
    d["placed"] = l->placed.count(b.name) > 0;  // already in the caller's tensor
    d["data"] = LoadedBuffer{l, const_cast<uint8_t*>(l->buffer(b.name)), b.nbytes, zero_copy && l->tier == Tier::Memory};
    buffers.append(d);
  }
  out["buffers"] = buffers;
  return out;
}

}  // namespace

PYBIND11_MODULE(_ckpt, m) {
  m.doc() = "Goodput flash checkpoints (C++ core)";
  py::register_exception<CheckpointError>(m, "CheckpointError", PyExc_RuntimeError);

  py::class_<LoadedBuffer>(m, "LoadedBuffer", py::buffer_protocol())
      .def_buffer([](LoadedBuffer& b) {
        return py::buffer_info(b.data, 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.nbytes)}, {1}, b.owner->tier == Tier::Memory && b.readonly);
      })
      .def("__len__", [](const LoadedBuffer& b) { return b.nbytes; });

  py::class_<FlashCheckpoint>(m, "FlashCheckpoint")
      .def(py::init([](const std::string& job, int rank, int world_size, const std::string& storage_dir,
                       const std::string& shm_prefix, int keep, bool peers_share_memory, bool memory) {
             Options o;
             o.job = job;
             o.rank = rank;
             o.world_size = world_size;
             o.storage_dir = storage_dir;
             o.shm_prefix = shm_prefix;
             o.keep = keep;
             o.peers_share_memory = peers_share_memory;
             o.memory = memory;
             return std::make_unique<FlashCheckpoint>(o);
           }),
           py::arg("job"), py::arg("rank") = 0, py::arg("world_size") = 1, py::arg("storage_dir") = "",
           py::arg("shm_prefix") = "", py::arg("keep") = 3, py::arg("peers_share_memory") = true,
           py::arg("memory") = true)
      // buffers: [(name, dtype, shape, data_ptr, nbytes)]; the caller keeps the memory alive.
      .def("save_raw",
           [](FlashCheckpoint& c, int64_t step,
              const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>, uintptr_t, uint64_t>>& bufs) {
             std::vector<BufferView> views;
             views.reserve(bufs.size());
             for (const auto& [name, dtype, shape, ptr, nbytes] : bufs)
               views.push_back(BufferView{name, dtype, shape, reinterpret_cast<const void*>(ptr), nbytes});
             SaveStats s;
             {
               py::gil_scoped_release release;
               s = c.save(step, views);
             }
             return py::dict(py::arg("bytes") = s.bytes, py::arg("seconds") = s.seconds, py::arg("object") = s.object);
           })
      .def("load_raw",
           [](FlashCheckpoint& c, std::optional<int64_t> step, bool zero_copy,
              std::optional<std::map<std::string, std::pair<uintptr_t, uint64_t>>> into) -> py::object {
             // into: buffer name -> (address, bytes) of memory the caller owns and keeps alive
             Destinations dest;
             if (into)
               for (const auto& [name, where] : *into) dest[name] = {reinterpret_cast<uint8_t*>(where.first), where.second};
             std::optional<Loaded> l;
             {
               py::gil_scoped_release release;
               l = c.load(step, zero_copy, into ? &dest : nullptr);
             }
             if (!l) return py::none();
             return loaded_to_dict(std::make_shared<Loaded>(std::move(*l)), zero_copy);
           },
           py::arg("step") = py::none(), py::arg("zero_copy") = false, py::arg("into") = py::none())
      .def("persist",
           [](FlashCheckpoint& c) {
             PersistStats s;
             {
               py::gil_scoped_release release;
               s = c.persist();
             }
             return py::dict(py::arg("written") = s.written, py::arg("step") = s.step, py::arg("bytes") = s.bytes,
                             py::arg("seconds") = s.seconds, py::arg("path") = s.path);
           })
      .def("newest_in_memory", &FlashCheckpoint::newest_in_memory)
      .def("storage_steps", &FlashCheckpoint::storage_steps)
      .def("memory_steps", &FlashCheckpoint::memory_steps)
      .def("complete_storage_steps", &FlashCheckpoint::complete_storage_steps)
      .def("remove_memory", &FlashCheckpoint::remove_memory)
      .def("drop_memory_after", &FlashCheckpoint::drop_memory_after, py::arg("step"))
      .def("reserve", &FlashCheckpoint::reserve, py::call_guard<py::gil_scoped_release>());

  py::class_<AsyncPersister>(m, "AsyncPersister")
      .def(py::init<FlashCheckpoint&>(), py::keep_alive<1, 2>())
      .def("request", &AsyncPersister::request)
      .def("drain", &AsyncPersister::drain, py::call_guard<py::gil_scoped_release>())
      .def("last_error", &AsyncPersister::last_error)
      .def("persisted_step", &AsyncPersister::persisted_step);
}
