//! `uprobe:BIN@FILE:LINE`: the addresses where BIN's DWARF line table says the
//! line's code starts (`weft_symbols::DebugInfo::line_sites`), each planned as a site
//! inside the function that holds it, as `uprobe:BIN:FUNC+OFF` is.

use anyhow::{anyhow, Result};
use weft_ir::AttachPoint;

use super::{module_of, Cx, PointcutKind, Resolved};
use crate::weave::Call;

pub struct SourceLine;

impl PointcutKind for SourceLine {
    fn handles(&self, a: &AttachPoint) -> bool {
        matches!(a, AttachPoint::SourceLine { .. })
    }

    fn resolve(
        &self,
        a: &AttachPoint,
        pi: usize,
        _name: u32,
        cx: &mut Cx<'_>,
        out: &mut Resolved,
    ) -> Result<()> {
        let AttachPoint::SourceLine { target, file, line } = a else {
            return Ok(());
        };
        let Some(module) = module_of(a, target, cx)? else {
            return Ok(());
        };
        let elf = module.open().map_err(|e| anyhow!("{a}: {e}"))?;
        let sites = weft_symbols::resolve_line(
            &elf,
            &weft_symbols::DebugSearch::system(),
            file,
            *line,
            Some(module.load_bias),
        )
        .map_err(|e| anyhow!("{a}: {e}"))?;
        let label = format!(
            "uprobe:{}@{file}:{line}",
            super::shown_binary(target, &module)
        );
        let probe = cx.names.intern(label.clone());
        for (f, offset) in sites {
            let Some(addr) = f.runtime_addr else { continue };
            let site_addr = addr + offset;
            let spec = out
                .sites
                .entry(site_addr)
                .or_insert_with(|| super::function_site(&f, addr, site_addr, &label));
            spec.entry.push(Call {
                advice: pi as u64,
                probe,
                body: Some(pi),
            });
        }
        Ok(())
    }
}
