// tally — does it fit, how fast, what does communication cost, how often to checkpoint.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <iostream>
#include <new>

#include "commands.hpp"
#include "common.hpp"
#include "tally/core/types.hpp"
#ifdef TALLY_HAS_ENGINE
#include "engine_commands.hpp"
#endif

int main(int argc, char** argv) {
  using namespace tally::cli;
  CLI::App app{"tally — training-run ledgers (memory, communication, pipeline, reliability), "
               "checked against real multi-process runs"};
  app.name("tally");
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every command");
  register_memory(app);
  register_comm(app);
  register_bubble(app);
  register_reliability(app);
  register_plan(app);
  register_compare(app);
#ifdef TALLY_HAS_ENGINE
  register_engine_commands(app);
#endif
  refuse_empty_values(app);  // Note [empty values] (common.hpp)
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line naming the flag, the value and what is allowed; exit 2 (bad input).
    std::cerr << "tally: error: " << e.what() << "\n";
    return kBadInput;
  } catch (const tally::InvalidInput& e) {
    std::cerr << "tally: error: " << e.what() << "\n";
    return kBadInput;
  } catch (const std::bad_alloc&) {
    std::cerr << "tally: error: out of memory\n";
    return kRunFailed;
  } catch (const std::exception& e) {
    std::cerr << "tally: error: " << e.what() << "\n";
    return kRunFailed;
  }
  return kOk;
}
