// Every command's flags refuse nonsense while the arguments are parsed: exit 2 and one line on
// stderr naming the flag, before any model is loaded. Values at the edges of the ranges are
// accepted: those runs reach the (missing) model and exit 1 instead. The real binary each time.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "test_support.h"

namespace ms {
namespace {

struct Refused {
  std::string args;  // after the command
  std::string flag;  // what the one line must name
};

// A model directory that exists but holds nothing: a run whose flags pass fails to load it (exit 1).
const std::string& empty_model() {
  static const std::string dir = test::scratch_dir("flags-model");
  return dir;
}

void expect_refused(const std::string& command, const Refused& c) {
  const std::string args = command + " " + c.args;
  SCOPED_TRACE(args);
  std::string out, err;
  EXPECT_EQ(test::run_cli(args, &out, &err), 2) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_NE(err.find(c.flag), std::string::npos) << err;
  EXPECT_TRUE(out.empty()) << out;
}

void expect_accepted(const std::string& args) {
  SCOPED_TRACE(args);
  std::string out, err;
  EXPECT_EQ(test::run_cli(args, &out, &err), 1) << err;  // past the flags, at the empty model directory
  EXPECT_NE(err.find(empty_model()), std::string::npos) << err;
}

const std::vector<Refused> kModelFlags = {
    {"--memory 0.9", "--memory"},       {"--memory ''", "--memory"},       {"--memory -1G", "--memory"},
    {"--memory 0", "--memory"},         {"--memory nan", "--memory"},      {"--memory inf", "--memory"},
    {"--memory 12Q", "--memory"},       {"--memory 1e30T", "--memory"},    {"--vram 0.5", "--vram"},
    {"--vram ''", "--vram"},            {"--vram -2G", "--vram"},          {"--host-cache -1", "--host-cache"},
    {"--host-cache x", "--host-cache"}, {"--context 0", "--context"},      {"--context -5", "--context"},
    {"--context 1e9", "--context"},     {"--context 99999999999", "--context"},
    {"--expert-slots 0", "--expert-slots"}, {"--expert-slots -3", "--expert-slots"},
    {"--expert-slots 2.5", "--expert-slots"}, {"--pool-profile /no/such/profile.json", "--pool-profile"},
    {"--policy fifo", "--policy"},      {"--io mmap", "--io"},             {"--device tpu", "--device"},
    {"--host-policy x", "--host-policy"}, {"--model ''", "--model"},
    {"--prefetch maybe", "--prefetch"}, {"--prefetch-ahead 0", "--prefetch-ahead"},
    {"--prefetch-ahead 2,1", "--prefetch-ahead"}, {"--prefetch-ahead x,1@4", "--prefetch-ahead"},
    {"--prefetch-ahead 2,1@-1", "--prefetch-ahead"}, {"--prefetch-width 0", "--prefetch-width"},
    {"--prefetch-width lots", "--prefetch-width"}, {"--prefetch-staging 0", "--prefetch-staging"},
    {"--kv-bits 5,3", "--kv-bits"},     {"--kv-bits 4,", "--kv-bits"},     {"--kv-bits four", "--kv-bits"},
    {"--kv-bits 4,3,2", "--kv-bits"},   {"--kv-group 48", "--kv-group"},   {"--kv-rotation so3", "--kv-rotation"},
    {"--cpu-experts some", "--cpu-experts"}, {"--cpu-experts -1", "--cpu-experts"},
    {"--threads 0", "--threads"},       {"--h2d-rate fast", "--h2d-rate"},
};

const std::vector<Refused> kSamplingFlags = {
    {"--temperature nan", "--temperature"}, {"--temperature -1", "--temperature"},
    {"--temperature inf", "--temperature"}, {"--temperature 1e3", "--temperature"},
    {"--top-p 0", "--top-p"},               {"--top-p 1.5", "--top-p"},
    {"--top-p nan", "--top-p"},             {"--top-p -0.1", "--top-p"},
    {"--top-k -1", "--top-k"},              {"--top-k 1.5", "--top-k"},
    {"--min-p nan", "--min-p"},             {"--min-p -0.5", "--min-p"},
    {"--min-p 2", "--min-p"},               {"--repetition-penalty 0", "--repetition-penalty"},
    {"--repetition-penalty nan", "--repetition-penalty"}, {"--repetition-penalty -1", "--repetition-penalty"},
    {"--presence-penalty nan", "--presence-penalty"}, {"--presence-penalty inf", "--presence-penalty"},
    {"--frequency-penalty -inf", "--frequency-penalty"}, {"--frequency-penalty 1e9", "--frequency-penalty"},
    {"--stop ''", "--stop"},                {"--stop x --stop ''", "--stop"},
    {"--max-tokens -1", "--max-tokens"},    {"--max-tokens nan", "--max-tokens"},
    {"--seed -1", "--seed"},                {"--seed x", "--seed"},
};

TEST(FlagChecks, RunAndChatRefuseNonsense) {
  for (const Refused& c : kModelFlags) expect_refused("run --prompt x", c);
  for (const Refused& c : kSamplingFlags) {
    expect_refused("run --prompt x", c);
    expect_refused("chat", c);
  }
  expect_refused("run", {"--prompt ''", "--prompt"});
  for (const Refused& c : std::vector<Refused>{{"--speculative fast", "--speculative"}, {"--draft 0", "--draft"},
                                               {"--draft 5", "--draft"}, {"--draft two", "--draft"}}) {
    expect_refused("run --prompt x", c);
    expect_refused("serve", c);
    expect_refused("generate --ids 1 --model " + empty_model(), c);
  }
}

TEST(FlagChecks, GenerateLogitsAndProfileRefuseNonsense) {
  const std::string m = "--model " + empty_model();
  for (const Refused& c : kModelFlags) {
    expect_refused("generate --ids 1 " + (c.flag == "--model" ? "" : m), c);
    expect_refused("logits --ids 1 --out x.safetensors " + (c.flag == "--model" ? "" : m), c);
  }
  expect_refused("generate --ids 1 " + m, {"--max-tokens 0", "--max-tokens"});
  expect_refused("generate --ids 1 " + m, {"--max-tokens 3000000000", "--max-tokens"});
  expect_refused("logits --ids 1 " + m, {"--out ''", "--out"});
  expect_refused("inspect", {"--model ''", "--model"});
  for (const Refused& c : std::vector<Refused>{{"--margin nan", "--margin"}, {"--margin 0.5", "--margin"},
                                               {"--max-tokens -1", "--max-tokens"}, {"--out ''", "--out"},
                                               {"--prompts /no/such/file", "--prompts"}})
    expect_refused("profile --prompts /dev/null", c);
  expect_refused("simulate --routes /dev/null", {"--slots 0", "--slots"});
  expect_refused("simulate --routes /dev/null --slots 4", {"--experts -2", "--experts"});
  expect_refused("simulate --slots 4", {"--routes /no/such/routes.safetensors", "--routes"});
}

TEST(FlagChecks, ServeRefusesNonsense) {
  for (const Refused& c : kModelFlags) expect_refused("serve", c);
  for (const Refused& c : std::vector<Refused>{
           {"--request-timeout nan", "--request-timeout"}, {"--request-timeout 1e300", "--request-timeout"},
           {"--request-timeout -1", "--request-timeout"},  {"--request-timeout 0", "--request-timeout"},
           {"--request-timeout inf", "--request-timeout"}, {"--drain-timeout nan", "--drain-timeout"},
           {"--drain-timeout 1e300", "--drain-timeout"},   {"--drain-timeout -1", "--drain-timeout"},
           {"--drain-timeout inf", "--drain-timeout"},     {"--port 70000", "--port"},
           {"--port -1", "--port"},                        {"--port http", "--port"},
           {"--queue-limit 0", "--queue-limit"},           {"--queue-limit 5000", "--queue-limit"},
           {"--max-body-bytes 0", "--max-body-bytes"},     {"--max-body-bytes 1e9", "--max-body-bytes"},
           {"--max-body-bytes 4294967296", "--max-body-bytes"}, {"--api-key ''", "--api-key"},
           {"--model-name ''", "--model-name"},            {"--host ''", "--host"},
           {"--header-timeout 0", "--header-timeout"},     {"--header-timeout nan", "--header-timeout"},
           {"--header-timeout 1e9", "--header-timeout"},   {"--body-timeout -1", "--body-timeout"},
           {"--body-timeout inf", "--body-timeout"},       {"--max-connections 0", "--max-connections"},
           {"--max-connections 1e6", "--max-connections"}, {"--max-client-connections 0", "--max-client-connections"},
           {"--max-client-connections -3", "--max-client-connections"}})
    expect_refused("serve", c);
}

TEST(FlagChecks, ConvertAndSynthRefuseNonsense) {
  for (const Refused& c : std::vector<Refused>{
           {"--proj-bits gate=5", "--proj-bits"},    {"--proj-bits gate=2,up=7", "--proj-bits"},
           {"--proj-bits gat=4", "--proj-bits"},     {"--proj-bits ate=4", "--proj-bits"},
           {"--proj-bits gate", "--proj-bits"},      {"--proj-bits =4", "--proj-bits"},
           {"--proj-bits gate=4,", "--proj-bits"},   {"--proj-bits gate=x", "--proj-bits"},
           {"--proj-bits ''", "--proj-bits"},        {"--layer-bits x:4", "--layer-bits"},
           {"--layer-bits 3:", "--layer-bits"},      {"--layer-bits -1:4", "--layer-bits"},
           {"--layer-bits 0:4,mtp:5", "--layer-bits"}, {"--layer-bits 0=4", "--layer-bits"},
           {"--proj-bits gate=4,gate=8", "'gate' is given twice"}, {"--layer-bits 3:8,3:4", "'3' is given twice"},
           {"--expert-bits 5", "--expert-bits"},     {"--expert-group 48", "--expert-group"},
           {"--dense-bits 2", "--dense-bits"},       {"--dense-group 0", "--dense-group"}})
    expect_refused("convert --from a --out b", c);
  expect_refused("convert --out b", {"--from ''", "--from"});
  expect_refused("convert --from a", {"--out ''", "--out"});
  for (const Refused& c : std::vector<Refused>{{"--layers 0", "--layers"}, {"--layers -2", "--layers"},
                                               {"--layers 2000000", "--layers"}, {"--layers 1e3", "--layers"}, {"--seed -1", "--seed"},
                                               {"--out ''", "--out"}, {"--expert-bits 7", "--expert-bits"}})
    expect_refused("synth --like tiny --out b", c);
}

TEST(FlagChecks, ValuesAtTheEdgesAreAccepted) {
  const std::string m = "--model " + empty_model();
  for (const std::string& flags :
       {"--memory 64M", "--memory 1.5GiB", "--memory 1000000", "--context 1", "--expert-slots 1", "--temperature 0",
        "--temperature 100", "--top-p 1", "--top-p 1e-3", "--min-p 0", "--min-p 1", "--top-k 0", "--max-tokens 0",
        "--repetition-penalty 1e-3", "--presence-penalty -2", "--frequency-penalty 2", "--seed 0", "--stop x --stop y",
        "--prefetch off", "--prefetch on", "--prefetch-ahead 1", "--prefetch-ahead 3,1@0", "--prefetch-width 1",
        "--prefetch-width auto", "--prefetch-staging 1"})
    expect_accepted("run --prompt x " + m + " " + flags);
  for (const std::string& flags : {"--drain-timeout 0", "--request-timeout 0.5", "--request-timeout 31536000", "--port 0",
                                   "--port 65535", "--queue-limit 1", "--max-body-bytes 1024", "--header-timeout 0.1",
                                   "--body-timeout 3600", "--max-connections 1", "--max-client-connections 65536"})
    expect_accepted("serve " + m + " " + flags);
}

}  // namespace
}  // namespace ms
