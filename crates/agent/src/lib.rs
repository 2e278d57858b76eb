//! libweft_agent.so
