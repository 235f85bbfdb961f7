#include "launcher/hostfile.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace braid::launcher {
namespace {

// A host name as ssh takes it: no spaces, no '@' or ':' (the filters' separators), not an option.
bool PlainHostName(absl::string_view h) {
  if (h.empty() || h[0] == '-') return false;
  for (char c : h) {
    if (c == '@' || c == ':' || c == ',' || c == '=' || c == '#' || c == '\'' || c == '"' ||
        absl::ascii_isspace(static_cast<unsigned char>(c)) || absl::ascii_iscntrl(static_cast<unsigned char>(c))) {
      return false;
    }
  }
  return true;
}

std::string HostList(const std::vector<HostSlots>& hosts) {
  std::vector<std::string> names;
  for (const HostSlots& h : hosts) names.push_back(h.host);
  return absl::StrJoin(names, ", ");
}

const HostSlots* Find(const std::vector<HostSlots>& hosts, absl::string_view name) {
  for (const HostSlots& h : hosts) {
    if (h.host == name) return &h;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<std::vector<HostSlots>> ParseHostfile(absl::string_view text,
                                                     const std::string& path) {
  std::vector<HostSlots> hosts;
  std::map<std::string, int> first_line;
  int line_no = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    absl::string_view line = raw.substr(0, raw.find('#'));
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", line_no, ": '", absl::StripAsciiWhitespace(raw), "': ", why,
          " (each line is 'HOST slots=N', e.g. 'worker-1 slots=4'; '#' starts a comment)"));
    };
    std::vector<absl::string_view> words = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (words.size() != 2) return bad("expected a host and its slots");
    absl::string_view slots = words[1];
    int n = 0;
    if (!absl::ConsumePrefix(&slots, "slots=") || !absl::SimpleAtoi(slots, &n) || n < 1) {
      return bad("the slots must be written slots=N with N a number >= 1");
    }
    if (!PlainHostName(words[0])) {
      return bad("a host name may not start with '-' or hold spaces, quotes or any of @:,=#");
    }
    std::string host(words[0]);
    if (auto it = first_line.find(host); it != first_line.end()) {
      return bad(absl::StrCat(host, " is listed twice (first on line ", it->second,
                              "); give each host one line with all its slots"));
    }
    first_line[host] = line_no;
    HostSlots h{host, {}};
    for (int s = 0; s < n; ++s) h.slots.push_back(s);
    hosts.push_back(std::move(h));
  }
  if (hosts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": lists no host; write one line per host, 'HOST slots=N'"));
  }
  return hosts;
}

absl::StatusOr<std::vector<HostSlots>> ReadHostfile(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    return absl::NotFoundError(absl::StrCat("--hostfile=", path, ": cannot read it: ", std::strerror(errno)));
  }
  std::stringstream text;
  text << f.rdbuf();
  return ParseHostfile(text.str(), path);
}

absl::StatusOr<std::vector<HostSlots>> FilterHosts(const std::vector<HostSlots>& hosts,
                                                   const std::string& include,
                                                   const std::string& exclude) {
  if (!include.empty() && !exclude.empty()) {
    return absl::InvalidArgumentError(
        "--include and --exclude were both given; give one of them (DeepSpeed's rule too)");
  }
  if (include.empty() && exclude.empty()) return hosts;
  const bool including = !include.empty();
  const std::string flag = including ? absl::StrCat("--include=", include) : absl::StrCat("--exclude=", exclude);
  // Per host: the slots chosen (include) or left (exclude).
  std::map<std::string, std::set<int>> chosen;
  if (!including) {
    for (const HostSlots& h : hosts) chosen[h.host].insert(h.slots.begin(), h.slots.end());
  }
  for (absl::string_view part : absl::StrSplit(including ? include : exclude, '@')) {
    std::vector<absl::string_view> host_slots = absl::StrSplit(part, absl::MaxSplits(':', 1));
    absl::string_view name = host_slots[0];
    if (name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": an empty host; write HOST or HOST:SLOT,SLOT, several separated by '@'"));
    }
    const HostSlots* h = Find(hosts, name);
    if (!h) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": host '", name,
                                                     "' is not in the hostfile (it lists ",
                                                     HostList(hosts), ")"));
    }
    std::vector<int> slots;
    if (host_slots.size() == 1) {
      slots = h->slots;
    } else {
      for (absl::string_view s : absl::StrSplit(host_slots[1], ',')) {
        int slot;
        if (!absl::SimpleAtoi(s, &slot)) {
          return absl::InvalidArgumentError(absl::StrCat(
              flag, ": '", part, "': slots are numbers separated by ',', e.g. ", name, ":0,1"));
        }
        if (!std::binary_search(h->slots.begin(), h->slots.end(), slot)) {
          return absl::InvalidArgumentError(absl::StrCat(
              flag, ": host ", name, " has no slot ", slot, " (the hostfile gives it slots=",
              h->slots.size(), ": 0..", h->slots.size() - 1, ")"));
        }
        slots.push_back(slot);
      }
    }
    std::set<int>& c = chosen[h->host];
    for (int s : slots) {
      if (including) c.insert(s);
      else c.erase(s);
    }
  }
  std::vector<HostSlots> out;
  for (const HostSlots& h : hosts) {  // the hostfile's order: node ranks follow it
    auto it = chosen.find(h.host);
    if (it == chosen.end() || it->second.empty()) continue;
    out.push_back({h.host, std::vector<int>(it->second.begin(), it->second.end())});
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " leaves no host to run on"));
  return out;
}

absl::StatusOr<HostfileNodes> SelectNodes(std::vector<HostSlots> hosts, int max_nodes,
                                          int nproc_per_node) {
  if (max_nodes > 0) {
    if (max_nodes > static_cast<int>(hosts.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nnodes=", max_nodes, " but the hostfile (after --include/--exclude) has only ",
          hosts.size(), " host(s): ", HostList(hosts)));
    }
    hosts.resize(max_nodes);
  }
  HostfileNodes out;
  if (nproc_per_node > 0) {
    for (HostSlots& h : hosts) {
      if (static_cast<int>(h.slots.size()) < nproc_per_node) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--nproc_per_node=", nproc_per_node, " but host ", h.host, " has only ",
            h.slots.size(), " slot(s) in the hostfile (after --include/--exclude)"));
      }
      h.slots.resize(nproc_per_node);
    }
    out.nproc_per_node = nproc_per_node;
  } else {
    out.nproc_per_node = static_cast<int>(hosts.front().slots.size());
    for (const HostSlots& h : hosts) {
      if (static_cast<int>(h.slots.size()) != out.nproc_per_node) {
        std::vector<std::string> counts;
        for (const HostSlots& g : hosts) counts.push_back(absl::StrCat(g.host, ": ", g.slots.size()));
        return absl::InvalidArgumentError(absl::StrCat(
            "the hosts have different numbers of slots (", absl::StrJoin(counts, ", "),
            "); Braid starts the same number of workers on every node: pick equal slots with "
            "--include/--exclude, or give --nproc_per_node"));
      }
    }
  }
  out.nodes = std::move(hosts);
  return out;
}

}  // namespace braid::launcher
