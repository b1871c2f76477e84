/**
 * The contract with the kernel (../SCHEMA.md, "Live updates"): states, deltas and comm messages the Python side
 * made (tests/test_delta_contract.py writes them), rebuilt here by delta.ts and the live panel.
 *
 * Reads the committed fixture, test/fixtures/delta_contract.json, or the file $NL_DELTA_CONTRACT names (the
 * Python test makes one anew and runs this file on it). A missing or empty fixture fails: never a silent pass.
 */

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

import { applyDelta, ICaps, IDelta, LiveRun } from '../src/delta';
import { ICommLike, LiveRuns } from '../src/live';
import { RunRenderer } from '../src/renderer';
import { MIME_TYPE } from '../src/schema';

interface IScenario {
  name: string;
  caps: ICaps;
  full: LiveRun;
  steps: { delta: IDelta; state: LiveRun }[];
}

interface IContract {
  version: number;
  scenarios: IScenario[];
  /** A run shown by PanelDisplay to a listening panel: each comm message as sent (data, first buffer as text). */
  wire: {
    run_id: string;
    messages: { data: unknown; buffer: string | null }[];
    final: LiveRun;
  };
}

const path =
  process.env.NL_DELTA_CONTRACT ||
  join(__dirname, 'fixtures', 'delta_contract.json');
const contract = JSON.parse(readFileSync(path, 'utf8')) as IContract;
const deltas = contract.scenarios.reduce(
  (count, scenario) => count + scenario.steps.length,
  0
);

describe(`the kernel's deltas (${path})`, () => {
  it('are there to check', () => {
    expect(contract.version).toBe(1);
    expect(contract.scenarios.length).toBeGreaterThan(0);
    expect(
      contract.scenarios.every(scenario => scenario.steps.length > 0)
    ).toBe(true);
    expect(contract.wire.messages.length).toBeGreaterThan(1);
    console.log(
      `delta contract: ${path}: ${deltas} deltas in ${contract.scenarios.length} scenarios`
    );
  });

  for (const scenario of contract.scenarios) {
    it(`${scenario.name}: each delta applied on the state before gives the kernel's next state`, () => {
      let state = scenario.full;
      scenario.steps.forEach((step, index) => {
        const before = structuredClone(state);
        const next = applyDelta(state, step.delta, scenario.caps);
        expect(
          next,
          `${scenario.name}, delta ${index + 1} (seq ${step.delta.seq})`
        ).toStrictEqual(step.state);
        expect(state).toStrictEqual(before); // the state it applied on is left as it was
        state = next;
      });
    });
  }

  it("wire: the live panel, given the messages as the kernel packed them, ends with the run's last state", () => {
    const { run_id: runId, messages, final } = contract.wire;
    const comms: ICommLike[] = [];
    const kernel = {
      createComm: () => {
        const comm: ICommLike = {
          open: () => undefined,
          send: () => undefined,
          onMsg: null,
          onClose: null
        };
        comms.push(comm);
        return comm;
      }
    };
    const runs = new LiveRuns();
    const renderer = new RunRenderer(undefined, { runs, kernel: () => kernel });
    // the output as it was when the panel opened its comm: the full message's state
    const first = JSON.parse(messages[0].buffer as string);
    void renderer.renderModel({
      data: { [MIME_TYPE]: { ...first.state, seq: 0 } }
    } as never);
    expect(comms).toHaveLength(1);
    for (const { data, buffer } of messages) {
      const buffers =
        buffer === null ? undefined : [new TextEncoder().encode(buffer).buffer];
      void comms[0].onMsg!({ content: { data }, buffers });
    }
    expect(runs.liveState(runId)).toStrictEqual(final);
    const lines = [
      ...renderer.node.querySelectorAll(
        '.nl-rank[data-rank="0"] .nl-line .nl-text'
      )
    ];
    expect(lines.map(node => node.textContent)).toEqual(
      final.ranks![0].lines!.map(line => line.text)
    );
    renderer.dispose();
  });
});
