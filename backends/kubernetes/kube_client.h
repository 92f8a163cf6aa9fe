// A Kubernetes API client on Boost.Beast + OpenSSL: configuration from a kubeconfig or from inside
// a pod, JSON requests with retries (429 with Retry-After, 5xx, no answer), and list + watch with
// resourceVersion, bookmarks, resume after a dropped stream and re-list after 410 Expired (an HTTP
// 410 or an ERROR frame in the stream).
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "net/http.h"

namespace goodput::kube {

struct KubeError : std::runtime_error {
  KubeError(const std::string& what, int code, std::string reason = "")
      : std::runtime_error(what), code(code), reason(std::move(reason)) {}
  int code = 0;        // HTTP status; 0: no answer
  std::string reason;  // the Status object's reason: NotFound, AlreadyExists, Expired...
};

struct KubeConfig {
  std::string server;     // https://host:port
  std::string namespace_ = "default";
  net::TlsClient tls;
  std::string token;      // a fixed bearer token
  std::string token_file; // or one read again before each request (service-account tokens rotate)
  std::string source;     // where this came from, for messages
};

// A kubeconfig file: its current context (or `context`), that context's cluster (server, CA as
// file or base64 data, insecure-skip-tls-verify) and user (token, tokenFile, client certificate
// and key as files or data). Errors name the file and the field.
KubeConfig load_kubeconfig(const std::string& path, const std::string& context = "");
// The same from the parsed document; `path` names it in errors and anchors relative file paths.
KubeConfig load_kubeconfig_json(const nlohmann::json& doc, const std::string& path, const std::string& context = "");
// Inside a pod: KUBERNETES_SERVICE_HOST/PORT, and the service account's token, CA and namespace
// under `dir` (/var/run/secrets/kubernetes.io/serviceaccount).
KubeConfig in_cluster_config(const std::string& dir = "/var/run/secrets/kubernetes.io/serviceaccount");
// Where a client finds its cluster, in kubectl's and client-go's order: the kubeconfig given; else,
// inside a pod (KUBERNETES_SERVICE_HOST set), its service account; else the first file $KUBECONFIG
// names (a colon-separated list); else ~/.kube/config.
KubeConfig default_config(const std::string& kubeconfig = "", const std::string& context = "");
// Base64 (a Secret's data, a kubeconfig's *-data); `where` names it in the error.
std::string base64(const std::string& in);
std::string base64_decode(const std::string& in, const std::string& where);
// YAML (a kubeconfig, a pod dumped by kubectl) as JSON.
nlohmann::json yaml_to_json(const std::string& yaml_text);

struct WatchEvent {
  std::string type;  // ADDED, MODIFIED, DELETED, BOOKMARK, ERROR
  nlohmann::json object;
};
// One newline-delimited watch frame; nullopt (and no throw) for a line that is not one.
std::optional<WatchEvent> parse_watch_frame(std::string_view line);

class KubeClient {
 public:
  explicit KubeClient(KubeConfig config, int attempts = 6);

  // One API call with retries; a non-2xx answer after them is a KubeError from its Status.
  nlohmann::json call(const std::string& method, const std::string& path, const nlohmann::json& body = nullptr,
                      const std::string& content_type = "application/json");
  // A JSON merge patch (RFC 7386) of one object, e.g. {"metadata": {"labels": {"k": "v"}}}.
  nlohmann::json merge_patch(const std::string& path, const nlohmann::json& patch) {
    return call("PATCH", path, patch, "application/merge-patch+json");
  }

  struct List {
    std::vector<nlohmann::json> items;
    std::string resource_version;
  };
  List list(const std::string& path, const std::string& label_selector = "");

  // Watches from resource_version (updated as events and bookmarks arrive) until the stream ends,
  // `cancel` is set, or the server says the version is too old: then returns true (re-list).
  bool watch(const std::string& path, const std::string& label_selector, std::string& resource_version,
             const std::atomic<bool>& cancel, const std::function<void(const WatchEvent&)>& on_event);

  const KubeConfig& config() const { return config_; }
  int64_t retries() const { return retries_; }
  int64_t throttled() const { return throttled_; }  // answers that were 429 Too Many Requests

 private:
  net::Headers headers() const;

  KubeConfig config_;
  net::Url url_;
  int attempts_;
  std::atomic<int64_t> retries_{0};
  std::atomic<int64_t> throttled_{0};
  std::atomic<int64_t> paused_until_{0};  // steady-clock ns: no call before then (the server's Retry-After)
};

std::string url_encode(const std::string& s);

}  // namespace goodput::kube
