#include "launcher/compose.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "core/plugin.h"

namespace braid::launcher {
namespace {

bool Has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::string Q(const std::string& s) { return absl::StrCat("\"", s, "\""); }

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// A layer as messages name it: "pipeline" (pipeline and data axes).
std::string Named(const std::string& name, const std::vector<std::string>& axes) {
  return absl::StrCat(Q(name), " (", absl::StrJoin(axes, " and "), " ax", axes.size() > 1 ? "es" : "is",
                      ")");
}

// The strategies serving `axis`, for a message: "ddp, zero (plugin libbraid_zero.so)".
std::string List(const std::vector<std::pair<std::string, std::string>>& found) {
  std::vector<std::string> names;
  for (const auto& [name, origin] : found) names.push_back(Q(name));
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

bool Provides(const StrategyTraits& traits, const std::vector<std::string>& features) {
  for (const std::string& f : features) {
    if (!Has(traits.features, f)) return false;
  }
  return true;
}

struct Chosen {
  std::string name;
  StrategyTraits traits;
  std::vector<std::string> axes;
};

absl::StatusOr<Chosen> Get(const std::string& name, const LayerCatalog& catalog,
                           const std::string& field) {
  absl::StatusOr<StrategyTraits> traits = catalog.traits_of(name);
  if (!traits.ok()) return Invalid(absl::StrCat(field, " ", Q(name), ": ", traits.status().message()));
  return Chosen{name, *traits, ServedAxes(*traits)};
}

// The one strategy serving `axis` (the first by name when several do), or why there is none.
absl::StatusOr<Chosen> ServingAxis(const std::string& axis, int size, const LayerCatalog& catalog,
                                   const std::string& below) {
  std::vector<std::pair<std::string, std::string>> found = catalog.serving(axis);
  if (found.empty()) {
    return Invalid(absl::StrCat("parallel.", axis, " is ", size, ", but no strategy on the plugin "
                                "search path serves the ", axis, " axis", below,
                                "; set parallel.", axis, " to 1 or add a plugin that serves it"));
  }
  return Get(found.front().first, catalog, absl::StrCat("the ", axis, "-axis strategy"));
}

// The strategy registered as the default for `data` data-parallel ranks
// (StrategyTraits::default_for), or why there is none: no claimant, or two.
absl::StatusOr<Chosen> DefaultLayer(int data, const LayerCatalog& catalog) {
  const auto wanted = data > 1 ? StrategyTraits::DefaultFor::kSeveralDataRanks
                               : StrategyTraits::DefaultFor::kOneDataRank;
  const std::string ranks = data > 1 ? absl::StrCat(data, " data-parallel ranks") : "one data-parallel rank";
  const std::vector<std::pair<std::string, std::string>> serving = catalog.serving(kAxisData);
  std::vector<Chosen> claimants;
  std::vector<std::string> origins;
  for (const auto& [name, origin] : serving) {
    absl::StatusOr<Chosen> c = Get(name, catalog, "strategy");
    if (!c.ok() || c->traits.default_for != wanted) continue;
    claimants.push_back(*std::move(c));
    origins.push_back(absl::StrCat(Q(name), " (", origin, ")"));
  }
  if (claimants.empty()) {
    return Invalid(absl::StrCat("the config names no strategy, and none on the plugin search path "
                                "is the default for ", ranks, "; name one in strategy.name: ",
                                List(serving)));
  }
  if (claimants.size() > 1) {
    return Invalid(absl::StrCat("the config names no strategy, and several on the plugin search path "
                                "claim to be the default for ", ranks, ": ",
                                absl::StrJoin(origins, " and "),
                                "; name one in strategy.name, or remove one plugin"));
  }
  return claimants.front();
}

}  // namespace

std::string Stack::Describe() const {
  std::vector<std::string> parts;
  for (const Layer& l : layers) {
    parts.push_back(absl::StrCat(l.strategy, " [", absl::StrJoin(l.axes, ", "), "]"));
  }
  return absl::StrJoin(parts, " > ");
}

LayerCatalog PluginLayerCatalog(const std::vector<std::string>& search_path,
                                const std::string& strategy_path) {
  LayerCatalog c;
  c.traits_of = [search_path, strategy_path](const std::string& name) -> absl::StatusOr<StrategyTraits> {
    if (!strategy_path.empty()) BRAID_RETURN_IF_ERROR(LoadPlugin(strategy_path, search_path));
    BRAID_RETURN_IF_ERROR(EnsureStrategy(name, search_path));
    return Registry::Get().GetStrategyTraits(name);
  };
  c.serving = [search_path](const std::string& axis) {
    // Files that fail to load are reported when a strategy is looked up by name; here they
    // simply serve nothing.
    (void)LoadAllPlugins(search_path);
    return Registry::Get().StrategiesServing(axis);
  };
  return c;
}

absl::StatusOr<Stack> ComposeStack(int tensor, int pipeline, int data, const std::string& named,
                                   const LayerCatalog& catalog,
                                   const std::vector<std::string>& features) {
  BRAID_CHECK(tensor >= 1 && pipeline >= 1 && data >= 1)
      << "ComposeStack(" << tensor << ", " << pipeline << ", " << data << "): a validated layout";
  // The layer that holds the training state: the named strategy, or the default for the layout.
  // A named strategy that serves the pipeline axis alone names that layer instead (a config
  // that says `strategy { name: "pipeline" }`), and the data axis gets the default.
  Chosen base;
  std::optional<Chosen> named_pipeline;
  if (!named.empty()) {
    BRAID_ASSIGN_OR_RETURN(base, Get(named, catalog, "strategy.name"));
    if (Has(base.axes, kAxisPipeline) && !Has(base.axes, kAxisData)) {
      named_pipeline = base;
      base = Chosen();
    }
  }
  if (base.name.empty()) {
    BRAID_ASSIGN_OR_RETURN(base, DefaultLayer(data, catalog));
    if (!Provides(base.traits, features)) {
      // The sections ask for more than the default has: the first strategy that serves the data
      // axis alone (not a pipeline that also does), trains this many data ranks, can be wrapped
      // when another layer wraps it, and provides every requested feature. None: keep the
      // default, and validation names the feature and who has it.
      const bool wrapped = tensor > 1 || pipeline > 1 || named_pipeline.has_value();
      for (const auto& [name, origin] : catalog.serving(kAxisData)) {
        absl::StatusOr<Chosen> c = Get(name, catalog, "strategy");
        if (!c.ok() || c->axes != std::vector<std::string>{kAxisData}) continue;
        if (c->traits.max_data_ranks > 0 && data > c->traits.max_data_ranks) continue;
        if (wrapped && !c->traits.cannot_be_wrapped.empty()) continue;
        if (!Provides(c->traits, features)) continue;
        base = *std::move(c);
        break;
      }
    }
  }
  if (!Has(base.axes, kAxisData)) {
    return Invalid(absl::StrCat(
        "strategy.name ", Named(base.name, base.axes),
        " does not serve the data axis, and the strategy a config names is the data-axis one; "
        "name one of ", List(catalog.serving(kAxisData)),
        " (or none) and give the layout in parallel { tensor pipeline data }"));
  }
  if (base.traits.max_data_ranks > 0 && data > base.traits.max_data_ranks) {
    return Invalid(absl::StrCat("strategy.name ", Q(base.name), " trains ", base.traits.max_data_ranks,
                                " data-parallel rank(s), but the data-parallel size is ", data,
                                "; name a data-parallel strategy (one of ", List(catalog.serving(kAxisData)),
                                ") or none"));
  }
  std::vector<Chosen> stack = {base};  // innermost first while building

  // A pipeline layer takes its stage count and groups from the mesh, never from its options:
  // named on a layout of one stage it would cut nothing (or cut by an option no layout
  // describes), so the config says where the stages go.
  if (named_pipeline.has_value() && pipeline == 1) {
    return Invalid(absl::StrCat("strategy.name ", Named(named_pipeline->name, named_pipeline->axes),
                                " cuts the model into stages along the pipeline axis, but "
                                "parallel.pipeline is 1; give the stage count as parallel { pipeline: N }"));
  }
  if ((pipeline > 1 || named_pipeline.has_value()) && !Has(base.axes, kAxisPipeline)) {
    Chosen pp;
    if (named_pipeline.has_value()) {
      pp = *named_pipeline;
    } else {
      BRAID_ASSIGN_OR_RETURN(pp, ServingAxis(kAxisPipeline, pipeline, catalog,
                                             absl::StrCat(" (", Q(base.name), " serves the data axis)")));
    }
    if (Has(pp.axes, kAxisData)) {
      return Invalid(absl::StrCat(
          "layers ", Named(pp.name, pp.axes), " and ", Named(base.name, {kAxisData}),
          " do not stack: ", Q(pp.name), " serves the data axis inside each stage itself and "
          "takes no data-axis layer; leave strategy.name empty (or name ", Q(pp.name),
          "), or set parallel.pipeline to 1"));
    }
    if (!base.traits.cannot_be_wrapped.empty()) {
      return Invalid(absl::StrCat("layers ", Named(pp.name, pp.axes), " and ",
                                  Named(base.name, {kAxisData}), " do not stack: ", Q(base.name),
                                  " cannot serve under another layer: ",
                                  base.traits.cannot_be_wrapped));
    }
    stack.push_back(pp);
  }

  if (tensor > 1) {
    const Chosen& below = stack.back();
    BRAID_ASSIGN_OR_RETURN(
        Chosen tp, ServingAxis(kAxisTensor, tensor, catalog,
                               absl::StrCat(" (", Q(below.name), " does not)")));
    if (!below.traits.cannot_be_wrapped.empty()) {
      return Invalid(absl::StrCat("layers ", Named(tp.name, tp.axes), " and ",
                                  Named(below.name, below.axes), " do not stack: ", Q(below.name),
                                  " cannot serve under a layer that splits the model: ",
                                  below.traits.cannot_be_wrapped,
                                  "; use another data-axis strategy (or none) or parallel.tensor 1"));
    }
    stack.push_back(tp);
  }

  Stack out;
  for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
    std::vector<std::string> axes;
    for (const char* a : {kAxisTensor, kAxisPipeline, kAxisData}) {
      const int size = std::string(a) == kAxisTensor ? tensor : std::string(a) == kAxisPipeline ? pipeline : data;
      // An axis is shown on the layer that serves it; a pipeline layer's data axis too.
      if (Has(it->axes, a) && (size > 1 || std::string(a) == kAxisData)) axes.push_back(a);
    }
    if (axes.empty()) axes = it->axes;
    out.layers.push_back({it->name, axes});
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Strategy>> BuildStack(const Stack& stack) {
  BRAID_CHECK(!stack.layers.empty()) << "an empty stack";
  std::unique_ptr<Strategy> inner;
  const Layer* below = nullptr;
  for (auto it = stack.layers.rbegin(); it != stack.layers.rend(); ++it) {
    BRAID_ASSIGN_OR_RETURN(std::unique_ptr<Strategy> layer, Registry::Get().MakeStrategy(it->strategy));
    if (inner != nullptr) {
      // A strategy declaring an outer axis that does not take the layer below (Strategy::Wrap's
      // default refuses): refused here, before the model is built, naming both layers.
      if (absl::Status st = layer->Wrap(std::move(inner)); !st.ok()) {
        return Invalid(absl::StrCat("layers ", Named(it->strategy, it->axes), " and ",
                                    Named(below->strategy, below->axes), " do not stack: ",
                                    Q(it->strategy), " did not take the layer below (", st.message(),
                                    "); a strategy serving the ", absl::StrJoin(it->axes, " and "),
                                    " axis wraps the one below it: derive it from WrappingStrategy "
                                    "(core/wrapping_strategy.h)"));
      }
    }
    inner = std::move(layer);
    below = &*it;
  }
  return inner;
}

absl::Status HandGroups(const Stack& stack, const DeviceMesh* mesh, Communicator& world,
                        StrategyContext* ctx) {
  BRAID_CHECK(!stack.layers.empty()) << "an empty stack";
  ctx->groups_below.clear();
  if (mesh == nullptr) {
    BRAID_CHECK(stack.layers.size() == 1) << "a stack of " << stack.layers.size()
                                          << " layers without a mesh: " << stack.Describe();
    ctx->comm = &world;
    return absl::OkStatus();
  }
  std::vector<std::vector<std::string>> axes;
  for (const Layer& l : stack.layers) axes.push_back(l.axes);
  if (absl::Status st = HandMeshGroups(*mesh, axes, ctx); !st.ok()) {
    return Invalid(absl::StrCat("stack ", stack.Describe(), ": ", st.message()));
  }
  return absl::OkStatus();
}

}  // namespace braid::launcher
