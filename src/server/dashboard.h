#pragma once
// `serve`'s dashboard: GET /dashboard is one self-contained page (its script and style inline,
// nothing fetched from elsewhere: the machine may be offline) that polls GET /api/dashboard about
// once a second and draws where each expert is, how often it is routed, each layer's hits and
// prediction, the tiers' fill and rates over time, and the memory plan. The poll is answered on
// an HTTP thread from a stats snapshot: the decode thread does no work for it.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/stats.h"
#include "server/metrics.h"

namespace ms {

std::string_view dashboard_page();

// Where each expert of each expert-store layer is now, one letter an expert, from the tiers top
// first (PoolTier::name's first letter: v VRAM, h the GPU's host tier, r the CPU's pools; d where
// no tier holds it: on disk).
std::vector<std::string> expert_places(const std::vector<PoolTier>& tiers);

// What the page polls: the snapshot's figures in compact form (cumulative counters; the page
// takes rates from their differences).
nlohmann::ordered_json dashboard_json(const StatsSnapshot& s, const Model& model, const QueueState& q);

}  // namespace ms
