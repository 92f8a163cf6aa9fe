// `goodput operator`: the GoodputJob operator (backends/kubernetes/kube_operator.h).
#include "cli/operator.h"

#include <signal.h>

#include <atomic>
#include <iostream>
#include <thread>

#include "backends/kubernetes/kube_operator.h"

namespace goodput {

void add_operator_command(CLI::App& app, int& rc) {
  static std::string kubeconfig, context, ns;
  static bool all_namespaces = false, quiet = false;
  static double resync_s = 2;
  auto* op = app.add_subcommand(
      "operator",
      "Run GoodputJobs (goodput.dev/v1alpha1): for each, its master (a pod running `goodput run` on the job, its event "
      "log on a volume), Service, ConfigMap and token Secret, all owned by the job; the master's /status is mirrored "
      "into the resource's status, with Events for failures and recoveries. Apply the CRD first: "
      "kubectl apply -f backends/kubernetes/deploy/crd.yaml");
  op->add_option("--kubeconfig", kubeconfig,
                 "Kubeconfig file (default: inside a pod its service account, else $KUBECONFIG, else ~/.kube/config)");
  op->add_option("--context", context, "The kubeconfig's context (default: its current one)");
  op->add_option("-n,--namespace", ns, "Watch GoodputJobs in this namespace (default: the context's, or the pod's)");
  op->add_flag("-A,--all-namespaces", all_namespaces, "Watch GoodputJobs in every namespace");
  op->add_option("--resync", resync_s, "Seconds between looks at every job (and its master's /status)")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  op->add_flag("--quiet", quiet, "No line per decision");
  op->footer("\nStops on SIGINT or SIGTERM; a new operator carries on from what the cluster holds (the jobs' status).");
  op->callback([&rc] {
    if (all_namespaces && !ns.empty()) throw CLI::ValidationError("--namespace", "give --namespace or --all-namespaces, not both");
    kube::OperatorOptions o;
    try {
      o.config = kube::default_config(kubeconfig, context);
    } catch (const kube::KubeError& e) {
      std::cerr << "goodput operator: " << e.what() << "\n";
      rc = 2;
      return;
    }
    o.namespace_ = all_namespaces ? "" : !ns.empty() ? ns : o.config.namespace_;
    o.resync = std::chrono::milliseconds(static_cast<int64_t>(resync_s * 1000));
    o.quiet = quiet;
    // SIGINT and SIGTERM end the run (every thread has them blocked; one waits for them).
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    static std::atomic<bool> stop{false};
    std::thread waiter([set] {
      int sig = 0;
      sigwait(&set, &sig);
      stop = true;
    });
    std::cerr << "goodput operator: watching GoodputJobs in "
              << (o.namespace_.empty() ? std::string("every namespace") : "namespace " + o.namespace_) << " on "
              << o.config.server << "\n";
    kube::Operator(o).run(stop);
    waiter.join();
    std::cerr << "goodput operator: stopped\n";
    rc = 0;
  });
}

}  // namespace goodput
