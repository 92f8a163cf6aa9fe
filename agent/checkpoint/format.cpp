#include "agent/checkpoint/format.h"

#include <cerrno>
#include <cstring>

namespace goodput::ckpt::detail {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string sys_error(const std::string& what) { return what + ": " + std::strerror(errno); }

nlohmann::json manifest_json(const Manifest& m) {
  nlohmann::json j;
  j["format_version"] = m.format_version;
  j["job"] = m.job;
  j["rank"] = m.rank;
  j["world_size"] = m.world_size;
  j["step"] = m.step;
  j["data_bytes"] = m.data_bytes;
  j["buffers"] = nlohmann::json::array();
  for (const BufferInfo& b : m.buffers)
    j["buffers"].push_back({{"name", b.name}, {"dtype", b.dtype}, {"shape", b.shape}, {"offset", b.offset},
                            {"nbytes", b.nbytes}, {"xxh3", b.xxh3}});
  return j;
}

Manifest manifest_from(const std::string& text) {
  Manifest m;
  try {
    const auto j = nlohmann::json::parse(text);
    m.format_version = j.at("format_version").get<uint32_t>();
    m.job = j.at("job").get<std::string>();
    m.rank = j.at("rank").get<int32_t>();
    m.world_size = j.at("world_size").get<int32_t>();
    m.step = j.at("step").get<int64_t>();
    m.data_bytes = j.at("data_bytes").get<uint64_t>();
    for (const auto& b : j.at("buffers")) {
      BufferInfo i;
      i.name = b.at("name").get<std::string>();
      i.dtype = b.at("dtype").get<std::string>();
      i.shape = b.at("shape").get<std::vector<int64_t>>();
      i.offset = b.at("offset").get<uint64_t>();
      i.nbytes = b.at("nbytes").get<uint64_t>();
      i.xxh3 = b.at("xxh3").get<uint64_t>();
      if (i.offset > m.data_bytes || i.nbytes > m.data_bytes - i.offset)
        throw CheckpointError("buffer '" + i.name + "' lies outside the data section");
      m.buffers.push_back(std::move(i));
    }
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(std::string("manifest is not valid: ") + e.what());
  }
  if (m.format_version != kFormatVersion)
    throw CheckpointError("format version " + std::to_string(m.format_version) + ", this build reads " +
                          std::to_string(kFormatVersion));
  return m;
}


// Checks the header and the manifest of a checkpoint image that starts at `base` and is `size`
// bytes long (the data is checked by the caller, fused with its copy).
Manifest check_manifest(const Header& h, const uint8_t* manifest) {
  if (XXH3_64bits(manifest, h.manifest_bytes) != h.manifest_xxh3) throw CheckpointError("manifest checksum mismatch");
  Manifest m = manifest_from(std::string(reinterpret_cast<const char*>(manifest), h.manifest_bytes));
  if (m.step != h.step || m.data_bytes != h.data_bytes) throw CheckpointError("header and manifest disagree");
  return m;
}

bool manifest_in_bounds(const Header& h, uint64_t size) {
  return h.manifest_offset >= kHeaderBytes && h.manifest_offset <= size && h.manifest_bytes <= size - h.manifest_offset;
}

// The header's version field names a format this build does not read: another version's
// checkpoint, or a damaged header? The manifest, checksummed apart from the header, tells: if it
// verifies and says this build's format, the header is what changed.
namespace {
[[noreturn]] void version_mismatch(const Header& h, const uint8_t* manifest) {
  if (manifest && XXH3_64bits(manifest, h.manifest_bytes) == h.manifest_xxh3) {
    const auto j = nlohmann::json::parse(manifest, manifest + h.manifest_bytes, nullptr, false);
    if (j.is_object() && j.value("format_version", -1) == static_cast<int>(kFormatVersion))
      throw CheckpointError("damaged header: its format version field reads " + std::to_string(h.version) +
                            " where its manifest (checksum verified) says " + std::to_string(kFormatVersion));
  }
  throw CheckpointError("format version " + std::to_string(h.version) + ", this build reads " + std::to_string(kFormatVersion));
}
}  // namespace

// `manifest`: the manifest's bytes where the caller has them (for a clearer message), or null.
void check_header(const Header& h, uint64_t size, const uint8_t* manifest) {
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) throw CheckpointError("not a Goodput checkpoint (bad magic)");
  if (h.version != kFormatVersion) version_mismatch(h, manifest);
  if (!manifest_in_bounds(h, size) || h.data_bytes > h.manifest_offset - kHeaderBytes)
    throw CheckpointError("truncated: header promises " + std::to_string(h.manifest_offset + h.manifest_bytes) +
                          " bytes, found " + std::to_string(size));
}

Header image_header(const Manifest& m, const std::string& manifest_text) {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kFormatVersion;
  h.state = 1;
  h.step = m.step;
  h.data_bytes = m.data_bytes;
  h.manifest_offset = kHeaderBytes + m.data_bytes;
  h.manifest_bytes = manifest_text.size();
  h.manifest_xxh3 = XXH3_64bits(manifest_text.data(), manifest_text.size());
  return h;
}

Manifest check_image(const uint8_t* base, uint64_t size, const Header& h) {
  check_header(h, size, manifest_in_bounds(h, size) ? base + h.manifest_offset : nullptr);
  return check_manifest(h, base + h.manifest_offset);
}

std::vector<uint64_t> buffer_sizes(const Manifest& m) {
  std::vector<uint64_t> s;
  for (const BufferInfo& b : m.buffers) s.push_back(b.nbytes);
  return s;
}

void check_sums(const Manifest& m, const std::vector<uint64_t>& got) {
  for (size_t i = 0; i < m.buffers.size(); ++i)
    if (got[i] != m.buffers[i].xxh3) throw CheckpointError("checksum mismatch in buffer '" + m.buffers[i].name + "'");
}

// Checksums every buffer where it lies; throws naming the first one that is wrong.
void verify_in_place(const Manifest& m, const uint8_t* data) {
  check_sums(m, for_chunks(buffer_sizes(m), [&](uint32_t b, uint64_t off, uint64_t n) {
               return XXH3_64bits(data + m.buffers[b].offset + off, n);
             }));
}

std::optional<int64_t> parse_step_dir(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() <= 5) return std::nullopt;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

}  // namespace goodput::ckpt::detail
