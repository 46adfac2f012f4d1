// hosts.h defines: TwoHosts, two machines made on this one: two Linux network namespaces (each a
// network stack of its own, with its own addresses and routes) whose processes also get a host name
// of their own, host0 and host1, joined by a virtual Ethernet cable (a veth pair). The cable's
// rate can be limited (tc's token bucket filter) and the cable cut (ip link set down), as a real
// link is. why_no_hosts(): what this machine lacks to make them.
#pragma once

#include <string>
#include <vector>

namespace lesson24 {

/// Where the program `name` is: the PATH, then the folders root's programs live in ("": nowhere).
std::string find_program(const std::string& name);

/// Why two hosts cannot be made here ("" when they can): not root, or no `ip`, `tc` or `unshare`.
std::string why_no_hosts();

/// Two hosts on one machine, made by the constructor and removed by the destructor (the namespaces,
/// the cable with them, and their files in /etc/netns), even when the program fails on the way.
/// What makes, limits and cuts the hosts is printed as the commands a learner would type as root.
class TwoHosts {
 public:
  /// Makes host0 (10.24.0.1) and host1 (10.24.0.2), the cable between them up and unlimited.
  /// Throws course::CourseError naming the command that failed (what it made is removed).
  TwoHosts();
  ~TwoHosts();
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  /// "host0" or "host1": the name each host's processes see as their host name.
  static std::string name(int host);
  /// Its address on the cable: "10.24.0.1" or "10.24.0.2".
  static std::string address(int host);
  /// The namespace of `host` ("gl24-<pid>-0"): unique to this process, so runs never collide.
  const std::string& netns(int host) const { return netns_[host]; }

  /// `argv` as a command that runs it on `host`: in its namespace, with its host name.
  std::vector<std::string> on(int host, const std::vector<std::string>& argv) const;
  /// Limits the cable to `gbit` Gbit/s each way (0: no limit but the machine's own).
  void limit(double gbit);
  /// The token bucket's size at `gbit`: what the cable lets through at once, at full speed.
  static long long burst_bytes(double gbit);
  /// A rate in tc's words: "10gbit", "100mbit"; "unlimited" for 0.
  static std::string rate_name(double gbit);
  /// Takes the cable down on both ends (ip link set down): the hosts and their processes live on.
  void cut();
  /// Puts the cable back up.
  void mend();

 private:
  void remove();
  std::string netns_[2];
  std::string cable_[2];  // each end's device, named for this process
  bool limited_ = false;
};

/// Namespaces left by an earlier run of this lesson that died (killed, so its destructor never
/// ran): removed, and how many.
int remove_stale_hosts();

}  // namespace lesson24
