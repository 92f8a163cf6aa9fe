#include "backends/kubernetes/kube_client.h"

#include <openssl/evp.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

namespace goodput::kube {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw KubeError("cannot read " + what + " " + path, 0);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

json yaml_node_to_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      json j = json::object();
      for (const auto& kv : n) j[kv.first.as<std::string>()] = yaml_node_to_json(kv.second);
      return j;
    }
    case YAML::NodeType::Sequence: {
      json j = json::array();
      for (const auto& x : n) j.push_back(yaml_node_to_json(x));
      return j;
    }
    case YAML::NodeType::Scalar: {
      const std::string s = n.Scalar();
      if (n.Tag() == "!") return s;  // quoted: a string, whatever it looks like
      // YAML 1.2's core schema: booleans, null, integers and floats (1.5, 2e-3, .5); the rest is text.
      if (s == "true" || s == "True" || s == "TRUE") return true;
      if (s == "false" || s == "False" || s == "FALSE") return false;
      if (s.empty() || s == "null" || s == "Null" || s == "NULL" || s == "~") return nullptr;
      char* end = nullptr;
      const long long i = std::strtoll(s.c_str(), &end, 10);
      if (*end == '\0') return i;
      static const std::regex kFloat(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");
      if (std::regex_match(s, kFloat)) return std::strtod(s.c_str(), nullptr);
      return s;
    }
    default:
      return nullptr;
  }
}

// metadata.resourceVersion, or "" when there is none (or it is not a string).
std::string resource_version_of(const json& j) {
  const json::json_pointer p("/metadata/resourceVersion");
  return j.is_object() && j.contains(p) && j[p].is_string() ? j[p].get<std::string>() : std::string();
}

}  // namespace

json yaml_to_json(const std::string& yaml_text) {
  try {
    return yaml_node_to_json(YAML::Load(yaml_text));
  } catch (const YAML::Exception& e) {
    throw KubeError(std::string("not valid YAML: ") + e.what(), 0);
  }
}

std::string base64(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string base64_decode(const std::string& in, const std::string& where) {
  std::string clean;
  for (char c : in)
    if (!std::isspace(static_cast<unsigned char>(c))) clean += c;
  std::string out(clean.size() / 4 * 3 + 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(clean.data()), static_cast<int>(clean.size()));
  if (n < 0 || clean.size() % 4 != 0) throw KubeError(where + " is not valid base64", 0);
  size_t pad = 0;
  while (pad < 2 && pad < clean.size() && clean[clean.size() - 1 - pad] == '=') ++pad;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

KubeConfig load_kubeconfig(const std::string& path, const std::string& context) {
  return load_kubeconfig_json(yaml_to_json(read_file(path, "kubeconfig")), path, context);
}

namespace {
KubeConfig kubeconfig_from(const json& j, const std::string& path, const std::string& context);
}

KubeConfig load_kubeconfig_json(const json& j, const std::string& path, const std::string& context) {
  try {
    return kubeconfig_from(j, path, context);
  } catch (const json::exception& e) {
    throw KubeError(path + ": a field has the wrong type (" + e.what() + ")", 0);
  }
}

namespace {
KubeConfig kubeconfig_from(const json& j, const std::string& path, const std::string& context) {
  const std::string where = path + ": ";
  auto named = [&](const char* list, const std::string& name, const char* inner) -> const json& {
    if (j.contains(list) && j[list].is_array())
      for (const json& e : j[list])
        if (e.is_object() && e.value("name", "") == name && e.contains(inner) && e[inner].is_object()) return e[inner];
    throw KubeError(where + "no " + std::string(list).substr(0, std::string(list).size() - 1) + " named '" + name + "'", 0);
  };
  const std::string ctx_name = !context.empty() ? context : j.value("current-context", std::string());
  if (ctx_name.empty()) throw KubeError(where + "field 'current-context' is empty and no context was given", 0);
  const json& ctx = named("contexts", ctx_name, "context");
  const json& cluster = named("clusters", ctx.value("cluster", ""), "cluster");
  const json& user = named("users", ctx.value("user", ""), "user");
  KubeConfig c;
  c.source = path + " (context " + ctx_name + ")";
  c.server = cluster.value("server", "");
  if (c.server.rfind("https://", 0) != 0 && c.server.rfind("http://", 0) != 0)
    throw KubeError(where + "field 'clusters[" + ctx.value("cluster", "") + "].cluster.server' must be an http(s) URL", 0);
  if (c.server.find(':', c.server.find("://") + 3) == std::string::npos)
    c.server += c.server.rfind("https://", 0) == 0 ? ":443" : ":80";
  c.namespace_ = ctx.value("namespace", std::string("default"));
  const fs::path base = fs::path(path).parent_path();
  auto rel = [&](const std::string& p) { return fs::path(p).is_relative() ? (base / p).string() : p; };
  if (cluster.contains("certificate-authority-data"))
    c.tls.ca_pem = base64_decode(cluster.value("certificate-authority-data", ""), where + "field 'certificate-authority-data'");
  else if (cluster.contains("certificate-authority"))
    c.tls.ca_file = rel(cluster.value("certificate-authority", ""));
  c.tls.insecure = cluster.value("insecure-skip-tls-verify", false);
  c.token = user.value("token", "");
  if (user.contains("tokenFile")) c.token_file = rel(user.value("tokenFile", ""));
  if (user.contains("client-certificate-data"))
    c.tls.cert_pem = base64_decode(user.value("client-certificate-data", ""), where + "field 'client-certificate-data'");
  else if (user.contains("client-certificate"))
    c.tls.cert_pem = read_file(rel(user.value("client-certificate", "")), "client certificate");
  if (user.contains("client-key-data"))
    c.tls.key_pem = base64_decode(user.value("client-key-data", ""), where + "field 'client-key-data'");
  else if (user.contains("client-key"))
    c.tls.key_pem = read_file(rel(user.value("client-key", "")), "client key");
  if (c.tls.cert_pem.empty() != c.tls.key_pem.empty())
    throw KubeError(where + "a client certificate needs its key (and the other way round)", 0);
  if (user.contains("exec") || user.contains("auth-provider"))
    throw KubeError(where + "user credentials from 'exec' or 'auth-provider' plugins are not supported: use a token, "
                            "a tokenFile or a client certificate",
                    0);
  return c;
}
}  // namespace

KubeConfig in_cluster_config(const std::string& dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (!host || !*host || !port || !*port)
    throw KubeError("not inside a Kubernetes pod (KUBERNETES_SERVICE_HOST/PORT unset): give backend.kubeconfig", 0);
  KubeConfig c;
  c.source = "in-cluster service account";
  const std::string h = std::string(host).find(':') != std::string::npos ? "[" + std::string(host) + "]" : host;
  c.server = "https://" + h + ":" + port;
  c.token_file = dir + "/token";
  c.tls.ca_file = dir + "/ca.crt";
  c.namespace_ = trim(read_file(dir + "/namespace", "service account namespace"));
  (void)read_file(c.token_file, "service account token");  // fail now, not at the first call
  return c;
}

KubeConfig default_config(const std::string& kubeconfig, const std::string& context) {
  if (!kubeconfig.empty()) return load_kubeconfig(kubeconfig, context);
  if (const char* host = std::getenv("KUBERNETES_SERVICE_HOST"); host && *host) return in_cluster_config();
  if (const char* list = std::getenv("KUBECONFIG"); list && *list) {
    std::stringstream ss(list);
    for (std::string path; std::getline(ss, path, ':');)
      if (!path.empty() && fs::exists(path)) return load_kubeconfig(path, context);
    throw KubeError(std::string("KUBECONFIG names no file that exists: ") + list, 0);
  }
  if (const char* home = std::getenv("HOME"); home && *home && fs::exists(fs::path(home) / ".kube" / "config"))
    return load_kubeconfig((fs::path(home) / ".kube" / "config").string(), context);
  throw KubeError("no cluster to talk to: not inside a Kubernetes pod (KUBERNETES_SERVICE_HOST unset), no KUBECONFIG, "
                  "no ~/.kube/config; give a kubeconfig",
                  0);
}

std::optional<WatchEvent> parse_watch_frame(std::string_view line) {
  const json j = json::parse(line.begin(), line.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("type") || !j["type"].is_string() || !j.contains("object") ||
      !j["object"].is_object())
    return std::nullopt;
  return WatchEvent{j["type"].get<std::string>(), j["object"]};
}

std::string url_encode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') out += static_cast<char>(c);
    else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

KubeClient::KubeClient(KubeConfig config, int attempts)
    : config_(std::move(config)), url_(net::Url::parse(config_.server)), attempts_(attempts) {}

net::Headers KubeClient::headers() const {
  net::Headers h{{"Accept", "application/json"}};
  // A projected service-account token is rotated by the kubelet: read it again every time.
  std::string token = config_.token;
  if (!config_.token_file.empty()) token = trim(read_file(config_.token_file, "token file"));
  if (!token.empty()) h.emplace_back("Authorization", "Bearer " + token);
  return h;
}

namespace {
// The Status object's message and reason, or the raw body.
std::pair<std::string, std::string> status_of(const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  auto text = [&](const char* k) { return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string(); };
  if (j.is_object() && text("kind") == "Status") return {text("message"), text("reason")};
  return {body.substr(0, 300), ""};
}
int retry_after_ms(const std::string& header, int fallback) {
  char* end = nullptr;
  const long s = std::strtol(header.c_str(), &end, 10);
  return !header.empty() && *end == '\0' && s >= 0 && s < 3600 ? static_cast<int>(s * 1000) : fallback;
}
}  // namespace

json KubeClient::call(const std::string& method, const std::string& path, const json& body,
                      const std::string& content_type) {
  int backoff = 100;
  const std::string text = body.is_null() ? "" : body.dump();
  for (int attempt = 1;; ++attempt) {
    // A 429's Retry-After holds every call of this client, not just the one it answered.
    if (const auto resume = std::chrono::steady_clock::time_point(std::chrono::nanoseconds(paused_until_.load()));
        resume > std::chrono::steady_clock::now())
      std::this_thread::sleep_until(resume);
    net::Headers h = headers();
    if (!text.empty()) h.emplace_back("Content-Type", content_type);
    const auto r = net::http_request(url_, method, path, h, text, 10000, &config_.tls);
    if (r && r->status >= 200 && r->status < 300) {
      const json j = json::parse(r->body, nullptr, false);
      if (j.is_discarded()) throw KubeError(method + " " + path + ": the answer is not JSON", r->status);
      return j;
    }
    const bool retry = !r || r->status == 429 || r->status >= 500;
    if (!retry || attempt >= attempts_) {
      if (!r) throw KubeError(method + " " + path + ": no answer from the API server at " + config_.server, 0);
      const auto [message, reason] = status_of(r->body);
      throw KubeError(method + " " + path + ": " + std::to_string(r->status) + " " + reason + ": " + message, r->status,
                      reason);
    }
    ++retries_;
    // 429: the server says when (Retry-After, seconds); otherwise back off exponentially.
    const int wait = r && r->status == 429 ? retry_after_ms(r->retry_after, backoff) : backoff;
    if (r && r->status == 429) {
      ++throttled_;
      const int64_t until = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                (std::chrono::steady_clock::now() + std::chrono::milliseconds(std::min(wait, 10000))).time_since_epoch())
                                .count();
      for (int64_t was = paused_until_.load(); was < until && !paused_until_.compare_exchange_weak(was, until);) {
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(wait, 10000)));
    backoff = std::min(backoff * 2, 5000);
  }
}

KubeClient::List KubeClient::list(const std::string& path, const std::string& label_selector) {
  std::string target = path;
  if (!label_selector.empty()) target += "?labelSelector=" + url_encode(label_selector);
  const json j = call("GET", target);
  List out;
  if (!j.contains("items") || !j["items"].is_array()) throw KubeError("GET " + target + ": no 'items' list", 200);
  for (const json& item : j["items"]) out.items.push_back(item);
  out.resource_version = resource_version_of(j);
  return out;
}

bool KubeClient::watch(const std::string& path, const std::string& label_selector, std::string& resource_version,
                       const std::atomic<bool>& cancel, const std::function<void(const WatchEvent&)>& on_event) {
  std::string target = path + "?watch=true&allowWatchBookmarks=true&timeoutSeconds=60";
  if (!resource_version.empty()) target += "&resourceVersion=" + url_encode(resource_version);
  if (!label_selector.empty()) target += "&labelSelector=" + url_encode(label_selector);
  std::string partial;
  bool expired = false;
  const net::StreamResult r = net::http_stream(
      url_, "GET", target, headers(), &config_.tls, 90000, cancel, [&](std::string_view data) {
        partial.append(data);
        size_t start = 0;
        for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
          const auto ev = parse_watch_frame(std::string_view(partial).substr(start, nl - start));
          if (!ev) continue;
          if (ev->type == "ERROR") {
            const json& code = ev->object.contains("code") ? ev->object["code"] : json();
            if (code.is_number_integer() && code.get<int>() == 410) expired = true;
            continue;
          }
          const std::string rv = resource_version_of(ev->object);
          if (ev->type != "BOOKMARK") on_event(*ev);
          if (!rv.empty()) resource_version = rv;  // after handling: a crash mid-event replays it
        }
        partial.erase(0, start);  // a frame cut in the middle is never handled
      });
  if (r.status == 410) return true;
  if (r.status != 0 && r.status != 200) {
    const auto [message, reason] = status_of(r.body);
    throw KubeError("watch " + path + ": " + std::to_string(r.status) + " " + reason + ": " + message, r.status, reason);
  }
  if (r.status == 0) throw KubeError("watch " + path + ": " + (r.error.empty() ? "no answer" : r.error), 0);
  return expired;
}

}  // namespace goodput::kube
