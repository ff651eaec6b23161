#pragma once
// The engine's stats in Prometheus' text exposition format (GET /metrics).
#include <string>

#include "runtime/stats.h"
#include "server/http_transport.h"

namespace ms {

struct QueueState {
  size_t waiting = 0, limit = 0;
  bool running = false;
};

std::string prometheus_text(const StatsSnapshot& s, const QueueState& q, const HttpCounters& http);

}  // namespace ms
